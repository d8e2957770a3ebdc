//go:build !amd64 || shmcache_noprefetch

package shmcache

import "unsafe"

// No prefetch instruction here: a batch touches its lines instead, with plain loads whose
// values only feed a sum nothing waits for.

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

// recordAhead is where the lines to ask for of the record of the key of hash h start (in
// the rings, a line's first byte) and how many follow the first, from the first slot of
// its tag on its probe path (at most aheadProbe slots from its home slot): from the line
// it starts in to want bytes on, its ring's end or recordLines lines, whichever comes
// first. ok is false if no such slot points inside the ring. prefetchRecords
// (prefetch_amd64.s) does the same.
func (t *table) recordAhead(h uint64, want int64) (first, more int64, ok bool) {
	mask := t.slots - 1
	b := int64(h & (NBuckets - 1))
	tag := int64(h >> tagShift)
	sl := int64(h>>bucketBits) & mask
	for range min(t.slots, aheadProbe) {
		e := t.slot(b, sl)
		if e == 0 {
			return 0, 0, false
		}
		if e>>posBits == tag {
			off := e&posMask - 1
			if off < 0 || off >= t.rsize {
				return 0, 0, false
			}
			r := b*t.rsize + off
			last := min(r+want, b*t.rsize+t.rsize) - 1
			first = r &^ (lineBytes - 1)
			return first, min((last-first)/lineBytes, recordLines-1), true
		}
		sl = (sl + 1) & mask
	}
	return 0, 0, false
}
