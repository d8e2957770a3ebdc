package shmcache

import (
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A file cut short under the mapping is an error naming the cache, not a SIGBUS.
func TestTruncatedUnderTheMappingIsAnErrorNotASIGBUS(t *testing.T) {
	path, r, keys := attachBase(t)
	var b Batch
	if err := r.GetMany(keys, &b); err != nil || b.Hits() == 0 {
		t.Fatalf("before: %v, %d hits", err, b.Hits())
	}
	if err := os.Truncate(path, page); err != nil {
		t.Fatal(err)
	}
	err := r.GetMany(keys, &b)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "cut short") {
		t.Fatalf("after truncate: %v, want a corrupt-cache error saying it was cut short", err)
	}
	if _, err := r.Stats(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("stats after truncate: %v", err)
	}
	if _, err := r.Status(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("status after truncate: %v", err)
	}
}

// flipper maps a golden segment's copy read-write beside the reader's read-only mapping,
// so a test can damage bytes under the reader and put them back.
func flipper(t *testing.T, path string) []byte {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	data, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(data) })
	return data
}

// Bytes of the golden keys' buckets (meta rows, index slots, rings) flipped at random under
// a reader: no panic escapes, every call returns well within the give-up bound.
func TestByteFlipsUnderAReader(t *testing.T) {
	path, r, keys := attachBase(t)
	seg := flipper(t, path)
	geo, _ := r.Geometry()
	var spans [][2]int64 // byte ranges of the keys' buckets
	var b Batch
	if err := r.GetMany(keys, &b); err != nil {
		t.Fatal(err)
	}
	for i := range b.Len() {
		bk := int64(b.hashes[i] & (NBuckets - 1))
		spans = append(spans, [2]int64{metaOff + bk*rowWords*word, rowWords * word},
			[2]int64{geo.indexOff() + bk*geo.Slots*word, geo.Slots * word},
			[2]int64{geo.ringOff() + bk*geo.Ring, geo.Ring})
	}
	rng := rand.New(rand.NewPCG(41, 1))
	n := 3000
	if testing.Short() {
		n = 300
	}
	for it := 0; it < n; it++ {
		var undo [][2]int64
		for f := 0; f < 1+rng.IntN(4); f++ {
			sp := spans[rng.IntN(len(spans))]
			off := sp[0] + rng.Int64N(sp[1])
			undo = append(undo, [2]int64{off, int64(seg[off])})
			seg[off] ^= byte(1 << rng.IntN(8))
		}
		t0 := time.Now()
		if err := r.GetMany(keys, &b); err != nil {
			t.Fatalf("flip %d: %v", it, err)
		}
		if d := time.Since(t0); d > 500*time.Millisecond {
			t.Fatalf("flip %d: a lookup took %v", it, d)
		}
		for i := len(undo) - 1; i >= 0; i-- {
			seg[undo[i][0]] = byte(undo[i][1])
		}
	}
}

// Flipped header bytes: attach succeeds or refuses with a typed error; it never panics.
func TestByteFlipsInTheHeader(t *testing.T) {
	c := goldenCases(t)["base"]
	path := writeGolden(t, c, nil)
	seg := flipper(t, path)
	rng := rand.New(rand.NewPCG(41, 2))
	for it := 0; it < 200; it++ {
		off := rng.IntN(hPartitions*word + word)
		old := seg[off]
		seg[off] ^= byte(1 << rng.IntN(8))
		r, err := AttachPath(path)
		if err == nil {
			r.Close()
		} else if !errors.Is(err, ErrNotACache) && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) {
			t.Fatalf("byte %d: %v", off, err)
		}
		seg[off] = old
	}
}

// FuzzLookup: `go test -fuzz FuzzLookup` writes arbitrary bytes over a golden bucket under a
// reader; the suite runs its seeds only.
func FuzzLookup(f *testing.F) {
	f.Add(uint32(0), []byte{0xff})
	f.Add(uint32(77824+8), []byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, off uint32, patch []byte) {
		path, r, keys := attachBase(t)
		seg := flipper(t, path)
		start := int(off) % (len(seg) - page) // the header is read at attach only
		copy(seg[page+start:], patch)
		var b Batch
		_ = r.GetMany(keys, &b)
		_, _ = r.Stats()
		_, _ = r.Status()
	})
}

// attachBase writes the "base" golden segment to a file of the test's own and attaches it,
// closed at the test's end; keys are its golden keys back to back.
func attachBase(t testing.TB) (path string, r *Cache, keys []byte) {
	c := goldenCases(t)["base"]
	path = writeGolden(t, c, nil)
	r, err := AttachPath(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	for _, k := range c.Keys {
		key, _ := hex.DecodeString(k.Key)
		keys = append(keys, key...)
	}
	return path, r, keys
}

// A readers' companion cut short under a reader (any member of the readers' group may)
// turns its counters off; lookups and stats go on (format section 13).
func TestACompanionCutShortTurnsTheCountersOff(t *testing.T) {
	name, path := shmName(t, "companion-cut")
	key, value := installBase(t, path, 0o600, 7)
	comp := writeCompanion(t, name, 7)
	c, err := Attach(name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if v, found, err := c.Get(key); err != nil || !found || string(v) != string(value) {
		t.Fatalf("before: %x, %v, %v", v, found, err)
	}
	if n := companionHits(t, comp); n != 1 {
		t.Fatalf("%d hits counted in the companion, want 1", n)
	}
	if err := os.Truncate(comp, 0); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if v, found, err := c.Get(key); err != nil || !found || string(v) != string(value) {
			t.Fatalf("after the companion was cut short: %x, %v, %v", v, found, err)
		}
	}
	if st, err := c.Stats(); err != nil || st.Hits != 4 {
		t.Fatalf("stats: %+v, %v", st, err)
	}
}
