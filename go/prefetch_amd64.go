//go:build amd64 && !shmcache_noprefetch

package shmcache

// Prefetches (PREFETCHT0, prefetch_amd64.s): hints that never fault and retire at once,
// so a batch keeps many cache misses in flight. Each call walks a group of keys, to keep
// calls few.

// prefetchBuckets asks for the meta row and the home index slot's line of each hash's bucket.
//
//go:noescape
func prefetchBuckets(t *table, hashes []uint64)

// prefetchRecords asks for the lines of each hash's record as recordAhead (prefetch_other.go)
// finds them (the index slots it reads are inside the key's bucket).
//
//go:noescape
func prefetchRecords(t *table, hashes []uint64, want int64)

func (t *table) fetchBuckets(hashes []uint64) int64 {
	prefetchBuckets(t, hashes)
	return 0
}

func (t *table) fetchRecords(hashes []uint64, want int64) int64 {
	prefetchRecords(t, hashes, want)
	return 0
}
