package shmcache

// A batch keeps many cache misses in flight: while key i is read, the lines of keys
// further on are on their way. On amd64 they are prefetched (prefetch_amd64.s): the meta
// row and home index slot aheadBucket keys ahead, the record aheadRecord keys ahead
// (through that index slot, which has arrived by then), as the Python reader's kernel
// does (engine/_lookup.py). Elsewhere Go has no prefetch instruction, so a batch is read
// in groups of touchGroup keys whose lines are touched with plain loads that nothing waits
// for, in tight loops: the meta rows and home index slots two groups ahead, the records
// one group ahead. Either way the reads are hints, made without the seqlock, and every
// index they use is bounded to the key's bucket.

import "unsafe"

const (
	aheadBucket = 32
	aheadRecord = 16
	touchGroup  = 32
	aheadValue  = 128 // value bytes of a record fetched ahead before a batch found any
	aheadProbe  = 16  // slots followed from the home slot looking for the key's tag
)

// tagged is the ring offset (in the segment's rings) of the record of the first slot of
// the key's tag on its probe path; -1 if none.
func (s *segment) tagged(h uint64) int64 {
	slots, ring := s.geo.Slots, s.geo.Ring
	mask := slots - 1
	b := int64(h & (NBuckets - 1))
	idx := s.index[b*slots : b*slots+slots]
	tag := int64(h >> tagShift)
	sl := int64(h>>bucketBits) & mask
	for range min(slots, aheadProbe) {
		e := idx[sl]
		if e == 0 {
			return -1
		}
		if e>>posBits == tag {
			if off := e&posMask - 1; off >= 0 && off < ring {
				return b*ring + off
			}
			return -1
		}
		sl = (sl + 1) & mask
	}
	return -1
}

// span is how far into a record to fetch: its ring's end at most.
func (s *segment) span(r, want int64) int64 {
	return min(want, s.geo.Ring-r%s.geo.Ring)
}

func (s *segment) prefetchBucket(h uint64) {
	b := int64(h & (NBuckets - 1))
	prefetch2(unsafe.Pointer(&s.meta[b*rowWords]), unsafe.Pointer(&s.index[b*s.geo.Slots+int64(h>>bucketBits)&(s.geo.Slots-1)]))
}

func (s *segment) prefetchRecord(h uint64, want int64) {
	if r := s.tagged(h); r >= 0 {
		prefetchLines(unsafe.Pointer(&s.ring[r]), int(s.span(r, want)))
	}
}

// touchBuckets loads the meta rows and home index slots of the keys of hashes.
func (s *segment) touchBuckets(hashes []uint64) (sink int64) {
	slots := s.geo.Slots
	for _, h := range hashes {
		b := int64(h & (NBuckets - 1))
		sink += s.meta[b*rowWords+mVersion] + s.index[b*slots+int64(h>>bucketBits)&(slots-1)]
	}
	return sink
}

// touchRecords loads a line every 64 bytes of the records the keys' tagged slots point at.
func (s *segment) touchRecords(hashes []uint64, want int64) (sink int64) {
	for _, h := range hashes {
		if r := s.tagged(h); r >= 0 {
			end := r + s.span(r, want)
			for p := r &^ 63; p < end; p += 64 {
				sink += int64(s.ring[max(p, r)])
			}
		}
	}
	return sink
}
