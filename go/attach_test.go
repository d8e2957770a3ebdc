package shmcache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// shmName is a cache name of this test process's own under /dev/shm, its file and its
// readers' companion removed when the test ends.
func shmName(t testing.TB, what string) (name, path string) {
	name = fmt.Sprintf("go-%s-%d", what, os.Getpid())
	path = shmDir + "/" + name
	os.Remove(path)
	t.Cleanup(func() {
		os.Remove(path)
		os.Remove(companionPath(name))
	})
	return name, path
}

// header is the first header words of a segment made by hand: an empty cache of this
// geometry (every bucket empty), the size derived as section 3 says.
func header(keySize, maxValue, slots, ring int64) map[int]int64 {
	size := align(fixedBytes+NBuckets*slots*word, page) + NBuckets*ring
	return map[int]int64{hMagic: Magic, hVersion: LayoutVersion, hKeySize: keySize, hMaxValue: maxValue,
		hNBuckets: NBuckets, hSlots: slots, hRing: ring, hSize: size, hCreationID: 4242, hCreatedNS: 1}
}

// writeSegment writes a segment of header words h to path, mode 0600: the whole file, or
// (sparse) its first page only, the rest a hole. fill, if given, changes the bytes first.
func writeSegment(t testing.TB, path string, h map[int]int64, sparse bool, fill func([]byte)) {
	size := h[hSize]
	n := size
	if sparse {
		n = page
	}
	data := make([]byte, n)
	for w, v := range h {
		binary.LittleEndian.PutUint64(data[w*word:], uint64(v))
	}
	if fill != nil {
		fill(data)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if sparse {
		if err := os.Truncate(path, size); err != nil {
			t.Fatal(err)
		}
	}
}

func allocated(t testing.TB, path string) int64 {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// A sparse file at the name whose header declares 257 MiB: attach and a lookup allocate
// only what they touch, not the whole declared size (MAP_POPULATE would fill the hole).
func TestASparseFileIsNotPopulated(t *testing.T) {
	name, path := shmName(t, "sparse")
	h := header(32, 256, minSlots, 32768)
	writeSegment(t, path, h, true, nil)
	before := allocated(t, path)
	c, err := Attach(name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, found, err := c.Get(make([]byte, 32)); err != nil || found {
		t.Fatalf("lookup: found %v, %v", found, err)
	}
	if got := allocated(t, path); got > before+(4<<20) {
		t.Fatalf("attach and one lookup allocated %d bytes of a %d-byte sparse file (%d before)", got, h[hSize],
			before)
	}
}

// A wholly allocated file is still populated: its pages are mapped at attach.
func TestAWholeFileIsPopulated(t *testing.T) {
	_, path := shmName(t, "whole")
	writeSegment(t, path, header(32, 256, minSlots, 512), false, nil)
	fd, f, err := openRegular("whole", path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFD(fd)
	if !f.whole() {
		t.Fatalf("a file written whole reads as sparse: %+v", f)
	}
}

// H_SLOTS = 2^46 passes its own check; the size derived from it does not overflow, and
// the error names the size as derived, as the Python reader's does.
func TestHugeSlotsAreReportedAsTheDerivedSize(t *testing.T) {
	path := t.TempDir() + "/slots.shm"
	h := header(32, 256, minSlots, 512)
	size := h[hSize]
	h[hSlots] = 1 << 46 // the size word and the file stay those of 8 slots
	writeSegment(t, path, h, false, nil)
	_, err := AttachPath(path)
	want := fmt.Sprintf("header field size is %d; it should be %d, as derived from slots=%d and ring=512", size,
		align(fixedBytes+NBuckets*(1<<46)*word, page)+NBuckets*512, int64(1)<<46)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v\nwant an error saying %q", err, want)
	}
}

// A name that is not a cache's name is a bad argument, never looked up; nothing at a valid
// name is not found, and that is fs.ErrNotExist too.
func TestNamesAndNotFound(t *testing.T) {
	for _, bad := range []string{"../x", "", ".hidden", "a/b", strings.Repeat("a", 201)} {
		if _, err := Attach(bad); !errors.Is(err, ErrBadArgument) || Kind(err) != "bad-argument" {
			t.Errorf("%q: %v (kind %q)", bad, err, Kind(err))
		}
	}
	name, _ := shmName(t, "missing")
	_, err := Attach(name)
	if !errors.Is(err, ErrNotFound) || !errors.Is(err, fs.ErrNotExist) || Kind(err) != "not-found" {
		t.Fatalf("missing: %v (kind %q)", err, Kind(err))
	}
	if !errors.Is(ErrPermission, fs.ErrPermission) || errors.Is(ErrNotACache, fs.ErrNotExist) {
		t.Fatal("ErrPermission is fs.ErrPermission; ErrNotACache is not fs.ErrNotExist")
	}
}

// Close on what a failed Attach returned (a nil *Cache) is no panic: `defer c.Close()`
// written before the error is checked stays harmless.
func TestCloseOfAFailedAttachIsANoOp(t *testing.T) {
	c, err := Attach(fmt.Sprintf("no-such-cache-%d", os.Getpid()))
	if !errors.Is(err, ErrNotFound) || c != nil {
		t.Fatalf("Attach of a missing cache: %v %v", c, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}
