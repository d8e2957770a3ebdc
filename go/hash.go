package shmcache

// The key's hash (docs/segment-format.md, section 8): XXH64 of its key_size bytes, seed 0.
// A batch hashes all its keys first, in one loop. Keys of 32 bytes (tx hashes, the cache's
// first use) take XXH64's path for exactly one 32-byte stripe, written out here so the
// loop has no call in it; every other size calls xxhash.Sum64. hash_test.go holds the two
// to the same answers.

import (
	"encoding/binary"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// XXH64's primes.
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime4 uint64 = 9650029242287828579

	// the lanes' starts for seed 0: prime1 + prime2 and 0 - prime1, modulo 2^64
	start1 uint64 = 6983438078262162902
	start4 uint64 = 7046029288634856825
)

// hashKeys sets hashes[i] to the hash of key i of keys (ks bytes each, back to back), or
// of list[i] when list is not nil.
func hashKeys(keys []byte, list [][]byte, ks int, hashes []uint64) {
	switch {
	case list != nil && ks == 32:
		for i, k := range list {
			hashes[i] = hash32((*[32]byte)(k))
		}
	case list != nil:
		for i, k := range list {
			hashes[i] = xxhash.Sum64(k)
		}
	case ks == 32:
		keys = keys[:len(hashes)*32]
		for i := range hashes {
			hashes[i] = hash32((*[32]byte)(keys[i*32:]))
		}
	default:
		for i := range hashes {
			hashes[i] = xxhash.Sum64(keys[i*ks : i*ks+ks])
		}
	}
}

// hash32 is XXH64 (seed 0) of a 32-byte key: one stripe of four lanes, merged, the
// length added, then the avalanche.
func hash32(k *[32]byte) uint64 {
	v1 := lane(start1, binary.LittleEndian.Uint64(k[0:]))
	v2 := lane(prime2, binary.LittleEndian.Uint64(k[8:]))
	v3 := lane(0, binary.LittleEndian.Uint64(k[16:]))
	v4 := lane(start4, binary.LittleEndian.Uint64(k[24:]))
	h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
	h = merge(h, v1)
	h = merge(h, v2)
	h = merge(h, v3)
	h = merge(h, v4)
	h += 32
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

func lane(acc, input uint64) uint64 { return bits.RotateLeft64(acc+input*prime2, 31) * prime1 }

func merge(acc, v uint64) uint64 { return (acc^lane(0, v))*prime1 + prime4 }
