package shmcache

// A batch keeps many cache misses in flight: while key i is read, the lines of keys
// further on are on their way, as the Python reader's kernel does (engine/_lookup.py).
// The batch goes in groups of aheadGroup keys; at the start of each, the meta rows and
// home index slots of the keys aheadBuckets groups on are asked for, and the records of
// the keys aheadRecords groups on, found through those index slots, which have arrived by
// then: the first slot of the key's tag on its probe path (recordAhead). On amd64 a
// group's lines are asked for by a prefetch of each (prefetch_amd64.s, one call a group
// and a stage); elsewhere Go has no prefetch instruction, and each line is touched with a
// plain load that nothing waits for (prefetch_other.go). Either way the reads are hints,
// made without the seqlock, and every address is inside the key's bucket.

const (
	aheadGroup   = 8
	aheadBuckets = 4   // groups: a bucket's lines are asked for 25-32 keys ahead
	aheadRecords = 2   // groups: a record's, 9-16 keys ahead
	recordLines  = 4   // the most lines of one record asked for: 256 bytes, a Teranode value's record whole
	aheadValue   = 128 // value bytes of a record fetched ahead before a batch found any
	aheadProbe   = 16  // slots followed from the home slot looking for the key's tag
	lineBytes    = 64
)

// ahead asks for the buckets' lines of group bg's keys and the records' of group rg's
// (either may be past the batch, or -1: none); want is how many bytes of a record to ask
// for. It returns what touching loads read (0 with prefetching).
func (t *table) ahead(hashes []uint64, bg, rg int, want int64) (sink int64) {
	if lo := bg * aheadGroup; bg >= 0 && lo < len(hashes) {
		sink += t.fetchBuckets(hashes[lo:min(len(hashes), lo+aheadGroup)])
	}
	if lo := rg * aheadGroup; rg >= 0 && lo < len(hashes) {
		sink += t.fetchRecords(hashes[lo:min(len(hashes), lo+aheadGroup)], want)
	}
	return sink
}
