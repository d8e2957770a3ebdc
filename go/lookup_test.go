package shmcache

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// keysInBuckets is n random 32-byte keys, back to back, each in a bucket of its own.
func keysInBuckets(n int) []byte {
	rng := rand.New(rand.NewPCG(45, 7))
	seen := map[uint64]bool{}
	var keys []byte
	for len(seen) < n {
		k := make([]byte, 32)
		for i := range k {
			k[i] = byte(rng.UintN(256))
		}
		if b := xxhash.Sum64(k) & (NBuckets - 1); !seen[b] {
			seen[b] = true
			keys = append(keys, k...)
		}
	}
	return keys
}

// attachHeld is a cache every bucket of which is held mid-write by a live process (odd
// version, the lock this process's owner word, as a writer stopped mid-write leaves it),
// closed at the test's end.
func attachHeld(t *testing.T) *Cache {
	path := t.TempDir() + "/held.shm"
	me := OwnerWord(os.Getpid())
	writeSegment(t, path, header(32, 256, minSlots, 512), false, func(data []byte) {
		for b := int64(0); b < NBuckets; b++ {
			row := metaOff + b*rowWords*word
			binary.LittleEndian.PutUint64(data[row+mLock*word:], uint64(me))
			binary.LittleEndian.PutUint64(data[row+mVersion*word:], 1)
		}
	})
	c, err := AttachPath(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Every bucket held mid-write by a live process (odd version, the lock this process's
// owner word, as a writer stopped mid-write leaves it): a batch of 1,024 keys in 1,024
// buckets waits STUCK_GIVE_UP in all, not per key, and counts 1,024 corruptions.
func TestTheStuckBoundIsPerCall(t *testing.T) {
	c := attachHeld(t)
	keys := keysInBuckets(1024)
	var b Batch
	t0 := time.Now()
	if err := c.GetMany(keys, &b); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	if b.Hits() != 0 || b.Corruptions != 1024 {
		t.Errorf("%d hits, %d corruptions; want 0 and 1024", b.Hits(), b.Corruptions)
	}
	if took > 10*time.Second {
		t.Errorf("the batch took %v: the bound is %v for the whole call", took, time.Duration(StuckGiveUpNS))
	}
}

// The hardest case of the bound: 2,000,000 keys over the held buckets (about 244 a bucket),
// so that a cost a key past the bound shows. Before, each key past it still spun SpinLimit
// loads on its bucket and searched the list of buckets given up: 3.3 s for 200,000 keys,
// about 33 s for these.
func TestTheStuckBoundHoldsForTwoMillionKeys(t *testing.T) {
	c := attachHeld(t)
	const n = 2_000_000
	keys := make([]byte, n*32)
	rng := rand.New(rand.NewPCG(55, 3))
	for i := range keys {
		keys[i] = byte(rng.UintN(256))
	}
	var b Batch
	t0 := time.Now()
	if err := c.GetMany(keys, &b); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	if b.Hits() != 0 || b.Corruptions != n {
		t.Errorf("%d hits, %d corruptions; want 0 and %d", b.Hits(), b.Corruptions, n)
	}
	if took > 10*time.Second {
		t.Errorf("the batch of %d keys took %v: the bound is %v for the whole call", n, took,
			time.Duration(StuckGiveUpNS))
	}
	if err := c.GetMany(keys[:32*1024], &b); err != nil || b.Corruptions != 1024 { // a new call: its own bound
		t.Errorf("the next call: %v, %d corruptions", err, b.Corruptions)
	}
}

// GetMany and ContainsMany without a Batch are an error of the call, not a panic.
func TestNoBatchIsABadArgument(t *testing.T) {
	_, r, keys := attachBase(t)
	for what, call := range map[string]func() error{
		"GetMany":      func() error { return r.GetMany(keys, nil) },
		"GetManyKeys":  func() error { return r.GetManyKeys([][]byte{keys[:32]}, nil) },
		"ContainsMany": func() error { return r.ContainsMany(keys, nil) },
	} {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%s(keys, nil) panicked: %v", what, p)
				}
			}()
			if err := call(); !errors.Is(err, ErrBadArgument) {
				t.Errorf("%s(keys, nil): %v", what, err)
			}
		}()
	}
}

// A hit whose value is empty is an empty slice, never nil (nil is a miss), alone in a
// fresh Batch and through Get.
func TestAnEmptyValueIsNotAMiss(t *testing.T) {
	_, r, _ := attachBase(t)
	n := 0
	for _, k := range goldenCases(t)["base"].Keys {
		if k.Value == nil || *k.Value != "" {
			continue
		}
		n++
		key, _ := hex.DecodeString(k.Key)
		var b Batch
		if err := r.GetMany(key, &b); err != nil || !b.Has(0) || b.Value(0) == nil || len(b.Value(0)) != 0 {
			t.Errorf("%s: batch value %#v (found %v, %v)", k.Why, b.Value(0), b.Has(0), err)
		}
		v, found, err := r.Get(key)
		if err != nil || !found || v == nil || len(v) != 0 {
			t.Errorf("%s: Get gives %#v, %v, %v", k.Why, v, found, err)
		}
	}
	if n == 0 {
		t.Fatal("the base golden segment has no empty value")
	}
}

// Get and Contains take one key of the cache's size. A key of twice the size whose first
// half is a present key was read as two keys, and Get answered the first half's value
// (issue 53, item 4: `watch` with a 32-byte key on a cache of 16-byte keys).
func TestOneKeyOfAnotherSizeIsRefused(t *testing.T) {
	c := goldenCases(t)["base"]
	r, err := AttachPath(writeGolden(t, c, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var present []byte
	for _, k := range c.Keys {
		if k.Value != nil {
			present, _ = hex.DecodeString(k.Key)
			break
		}
	}
	if v, ok, err := r.Get(present); err != nil || !ok || v == nil {
		t.Fatalf("the present key: %v %v %v", v, ok, err)
	}
	for _, key := range [][]byte{append(append([]byte{}, present...), present...), present[:16], nil} {
		if v, ok, err := r.Get(key); !errors.Is(err, ErrKeySize) || ok || v != nil {
			t.Errorf("Get of a %d-byte key: %x %v %v; want ErrKeySize", len(key), v, ok, err)
		}
		if ok, err := r.Contains(key); !errors.Is(err, ErrKeySize) || ok {
			t.Errorf("Contains of a %d-byte key: %v %v; want ErrKeySize", len(key), ok, err)
		}
	}
}
