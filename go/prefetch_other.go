//go:build !amd64 || shmcache_noprefetch

package shmcache

import "unsafe"

// No prefetch instruction here: a batch touches its lines instead, with plain loads whose
// values only feed a sum nothing waits for.

const havePrefetch = false

// fetchBuckets touches the meta row and the home index slot of each hash's bucket.
func (t *table) fetchBuckets(hashes []uint64) (sink int64) {
	mask := t.slots - 1
	for _, h := range hashes {
		b := int64(h & (NBuckets - 1))
		sink += t.meta[b*rowWords+mVersion] + t.slot(b, int64(h>>bucketBits)&mask)
	}
	return sink
}

// fetchRecords touches the lines of each hash's record as recordAhead finds them.
func (t *table) fetchRecords(hashes []uint64, want int64) (sink int64) {
	for _, h := range hashes {
		if first, more, ok := t.recordAhead(h, want); ok {
			for j := range more + 1 {
				sink += int64(*(*byte)(unsafe.Add(t.ring, first+j*lineBytes)))
			}
		}
	}
	return sink
}
