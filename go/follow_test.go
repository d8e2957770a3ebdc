package shmcache

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// replaceAt puts data at path as a new file (another inode), in one rename, as a creator
// names a whole segment.
func replaceAt(t testing.TB, path string, data []byte, mode os.FileMode) {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, mode); err != nil { // whatever the umask
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// installBase puts the base golden segment at path (its creation id patched), mode mode;
// it returns a key of it with a non-empty value, and that value.
func installBase(t testing.TB, path string, mode os.FileMode, creationID int64) (key, value []byte) {
	c := goldenCases(t)["base"]
	data := goldenBytes(t, c.File)
	binary.LittleEndian.PutUint64(data[hCreationID*word:], uint64(creationID))
	replaceAt(t, path, data, mode)
	for _, k := range c.Keys {
		if k.Value != nil && *k.Value != "" {
			key, _ = hex.DecodeString(k.Key)
			value, _ = hex.DecodeString(*k.Value)
			return key, value
		}
	}
	t.Fatal("the base golden segment has no key with a value")
	return nil, nil
}

// until calls get until it returns an error of kind want (the test fails after 5 s); no
// call may return the old value once the cache it came from is gone.
func until(t *testing.T, what string, want error, get func() ([]byte, error), old []byte) error {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := get()
		if errors.Is(err, want) {
			return err
		}
		if err == nil && bytes.Equal(v, old) && old != nil {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the old value is still served after 5 s", what)
			}
		} else if time.Now().After(deadline) {
			t.Fatalf("%s: %x, %v; want an error of kind %v", what, v, err, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A handle that follows a name serves what is at the name now: the cache destroyed and a
// file that is not a cache put there, a FIFO, nothing, a file others may write, another
// user's file (an owner named), then a new cache. Each is that file's error, never the old
// value; the new cache is mapped and served.
func TestAFollowedNameServesWhatIsThereNow(t *testing.T) {
	name, path := shmName(t, "follow")
	key, value := installBase(t, path, 0o600, 1)
	c, err := Attach(name, WithOwner("root"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	get := func() ([]byte, error) {
		v, found, err := c.Get(key)
		if err == nil && !found {
			v = []byte("miss")
		}
		return v, err
	}
	if v, err := get(); err != nil || !bytes.Equal(v, value) {
		t.Fatalf("before: %x, %v", v, err)
	}

	noise := make([]byte, 1<<20)
	rand.Read(noise)
	replaceAt(t, path, noise, 0o600)
	until(t, "random bytes at the name", ErrNotACache, get, value)

	os.Remove(path)
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := until(t, "a FIFO at the name", ErrNotACache, get, value); !strings.Contains(err.Error(), "a FIFO") {
		t.Errorf("a FIFO: %v", err)
	}

	os.Remove(path)
	if err := until(t, "nothing at the name", ErrNotFound, get, value); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("nothing: %v", err)
	}

	installBase(t, path, 0o666, 2)
	until(t, "a file others may write", ErrUnsafeMode, get, value)

	installBase(t, path, 0o600, 3)
	if err := os.Chown(path, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	until(t, "another user's file", ErrWrongOwner, get, value)

	installBase(t, path, 0o600, 4)
	deadline := time.Now().Add(5 * time.Second)
	for {
		id, err := c.CreationID()
		if v, _ := get(); err == nil && id == 4 && bytes.Equal(v, value) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new cache is not served after 5 s: creation id %d, %v", id, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Goroutines look up under a name that keeps changing (run with -race): each call gets the
// value or an error of the file at the name, never a crash or a torn value.
func TestFollowingUnderConcurrentLookups(t *testing.T) {
	name, path := shmName(t, "follow-race")
	key, value := installBase(t, path, 0o600, 1)
	c, err := Attach(name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var stop atomic.Bool
	var wg sync.WaitGroup
	var hits, errs atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b Batch
			for !stop.Load() {
				switch err := c.GetMany(key, &b); {
				case err == nil && b.Has(0) && !bytes.Equal(b.Value(0), value):
					t.Errorf("value %x", b.Value(0))
					return
				case err == nil:
					hits.Add(1)
				case errors.Is(err, ErrNotFound), errors.Is(err, ErrNotACache):
					errs.Add(1)
				default:
					t.Errorf("lookup: %v", err)
					return
				}
			}
		}()
	}
	for i := range 10 { // each change is waited for: the readers must have met it
		seen := errs.Load()
		os.Remove(path)
		waitFor(t, "a reader to meet nothing at the name", func() bool { return errs.Load() > seen })
		id := int64(10 + i)
		installBase(t, path, 0o600, id)
		waitFor(t, "the new cache to be mapped", func() bool { got, err := c.CreationID(); return err == nil && got == id })
		seen = hits.Load()
		waitFor(t, "a reader to hit in it", func() bool { return hits.Load() > seen })
	}
	stop.Store(true)
	wg.Wait()
}
