package shmcache

import (
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// The batch's hashes are XXH64 of each key (format section 8), whatever its size and form:
// the written-out 32-byte path and xxhash.Sum64 give the same answer.
func TestHashKeysIsXXH64(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 45))
	for _, ks := range []int{1, 7, 8, 31, 32, 33, 64, 100} {
		n := 300
		flat := make([]byte, n*ks)
		for i := range flat {
			flat[i] = byte(rng.Uint32())
		}
		list := make([][]byte, n)
		for i := range list {
			list[i] = flat[i*ks : i*ks+ks]
		}
		got, gotList := make([]uint64, n), make([]uint64, n)
		hashKeys(flat, nil, ks, got)
		hashKeys(nil, list, ks, gotList)
		for i := range n {
			if want := xxhash.Sum64(list[i]); got[i] != want || gotList[i] != want {
				t.Fatalf("key size %d, key %x: hashes %x (flat) and %x (list), XXH64 %x", ks, list[i], got[i],
					gotList[i], want)
			}
		}
	}
}

func FuzzHash32(f *testing.F) {
	f.Add(make([]byte, 32))
	f.Add([]byte("0123456789abcdef0123456789abcdef"))
	f.Fuzz(func(t *testing.T, k []byte) {
		if len(k) != 32 {
			return
		}
		if got, want := hash32((*[32]byte)(k)), xxhash.Sum64(k); got != want {
			t.Fatalf("hash32(%x) = %x, XXH64 %x", k, got, want)
		}
	})
}
