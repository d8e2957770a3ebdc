package shmcache

import (
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
)

const nobody = 65534 // the tests run as root and chown files to nobody

// A cache another user owns is refused when the reader names its owner (by name or by
// uid), before a byte of it is read; a reader told nothing reads it.
func TestAnotherUsersCacheIsRefusedWithAnOwner(t *testing.T) {
	name, path := shmName(t, "owner")
	key, value := installBase(t, path, 0o600, 1)
	if err := os.Chown(path, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	for _, owner := range []string{"root", "0"} {
		_, err := Attach(name, WithOwner(owner))
		if !errors.Is(err, ErrWrongOwner) || Kind(err) != "wrong-owner" || !strings.Contains(err.Error(), name) ||
			!strings.Contains(err.Error(), "uid 65534 (nobody)") || !strings.Contains(err.Error(), "uid 0 (root)") {
			t.Errorf("owner %s: %v (kind %q)", owner, err, Kind(err))
		}
	}
	for _, opts := range [][]Option{nil, {WithOwner("nobody")}, {WithOwner("65534")}} {
		c, err := Attach(name, opts...)
		if err != nil {
			t.Fatalf("%d options: %v", len(opts), err)
		}
		if v, found, err := c.Get(key); err != nil || !found || string(v) != string(value) {
			t.Errorf("%d options: %x, %v, %v", len(opts), v, found, err)
		}
		c.Close()
	}
	for _, owner := range []string{"no-such-user-of-this-machine", "", "-1", "12ab"} {
		if _, err := Attach(name, WithOwner(owner)); !errors.Is(err, ErrBadArgument) {
			t.Errorf("owner %q: %v", owner, err)
		}
	}
}

// A file its group or others may write is refused, owner named or not.
func TestAFileOthersMayWriteIsRefused(t *testing.T) {
	name, path := shmName(t, "mode")
	installBase(t, path, 0o600, 1)
	for _, mode := range []os.FileMode{0o666, 0o620, 0o602, 0o622} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		for _, opts := range [][]Option{nil, {WithOwner("root")}} {
			_, err := Attach(name, opts...)
			if !errors.Is(err, ErrUnsafeMode) || Kind(err) != "unsafe-mode" || !strings.Contains(err.Error(), name) {
				t.Errorf("mode %04o, %d options: %v", mode, len(opts), err)
			}
		}
		if _, err := AttachPath(path); !errors.Is(err, ErrUnsafeMode) {
			t.Errorf("mode %04o, by path: %v", mode, err)
		}
	}
	for _, mode := range []os.FileMode{0o600, 0o640, 0o644, 0o400} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		c, err := Attach(name)
		if err != nil {
			t.Errorf("mode %04o: %v", mode, err)
			continue
		}
		c.Close()
	}
}

// writeCompanion makes a readers' companion for the cache of this creation id.
func writeCompanion(t *testing.T, name string, creationID int64) string {
	path := companionPath(name)
	data := make([]byte, companionSize)
	binary.LittleEndian.PutUint64(data[0:], companionMagic)
	binary.LittleEndian.PutUint64(data[word:], companionVersion)
	binary.LittleEndian.PutUint64(data[companionCreation*word:], uint64(creationID))
	if err := os.WriteFile(path, data, 0o660); err != nil {
		t.Fatal(err)
	}
	return path
}

// companionHits is the sum of the hits counted in a companion's rows.
func companionHits(t *testing.T, path string) (n int64) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for r := range maxReaders {
		n += int64(binary.LittleEndian.Uint64(data[page+(r*rowWords+rHits)*word:]))
	}
	return n
}

// With an owner named, a readers' companion another user owns is not counted in; the
// cache is read all the same. Told nothing, a reader counts there.
func TestAnotherUsersCompanionIsNotUsedWithAnOwner(t *testing.T) {
	name, path := shmName(t, "owner-companion")
	key, _ := installBase(t, path, 0o600, 1)
	c0, err := AttachPath(path)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := c0.CreationID()
	c0.Close()
	comp := writeCompanion(t, name, id)
	if err := os.Chown(comp, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	c, err := Attach(name, WithOwner("root"))
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := c.Get(key); err != nil || !found {
		t.Fatalf("lookup with another user's companion: %v, %v", found, err)
	}
	c.Close()
	if n := companionHits(t, comp); n != 0 {
		t.Fatalf("a reader told its owner counted %d hits in nobody's companion", n)
	}
	c, err = Attach(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, found, err := c.Get(key); err != nil || !found {
		t.Fatalf("lookup: %v, %v", found, err)
	}
	c.Close()
	if n := companionHits(t, comp); n != 1 {
		t.Fatalf("a reader told no owner counted %d hits in the companion, want 1", n)
	}
}
