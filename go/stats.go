package shmcache

import "sync/atomic"

// Stats is a snapshot of a cache's figures, read without locks ([format section 15]); the
// JSON names are those of the Python reader's stats() and of every reader's `stats`.
//
// [format section 15]: https://github.com/shmcache/shmcache/blob/main/docs/segment-format.md#15-stats
type Stats struct {
	Name          string  `json:"name"`
	Entries       int64   `json:"entries"`
	BytesUsed     int64   `json:"bytes_used"`
	CapacityBytes int64   `json:"capacity_bytes"`
	MaxEntries    int64   `json:"max_entries"`
	Memory        int64   `json:"memory"`
	Evictions     int64   `json:"evictions"`
	LockTakeovers int64   `json:"lock_takeovers"`
	Sets          int64   `json:"sets"`
	Deletes       int64   `json:"deletes"`
	Writers       int64   `json:"writers"`
	Hits          int64   `json:"hits"`   // this handle's
	Misses        int64   `json:"misses"` // this handle's
	ReadRetries   int64   `json:"read_retries"`
	ReaderHits    int64   `json:"reader_hits"` // every reader process's, from the companion
	ReaderMisses  int64   `json:"reader_misses"`
	ReaderBatches int64   `json:"reader_batches"`
	Readers       int64   `json:"readers"` // reader processes alive with a row
	Corruptions   int64   `json:"corruptions"`
	KeySize       int64   `json:"key_size"`
	MaxValue      int64   `json:"max_value"`
	Buckets       int64   `json:"buckets"`
	LayoutVersion int64   `json:"layout_version"`
	CreationID    int64   `json:"creation_id"`
	CreatedS      float64 `json:"created_s"`
}

// Stats sums the buckets' and writers' counters and the readers' companion.
func (c *Cache) Stats() (st Stats, err error) {
	s, err := c.acquire()
	if err != nil {
		return st, err
	}
	defer c.mu.RUnlock()
	err = protect(func() error {
		for b := int64(0); b < NBuckets; b++ {
			m := s.meta[b*rowWords : (b+1)*rowWords]
			st.Entries += atomic.LoadInt64(&m[mLive])
			st.BytesUsed += atomic.LoadInt64(&m[mLiveBytes])
			st.Evictions += atomic.LoadInt64(&m[mEvictions])
			st.LockTakeovers += atomic.LoadInt64(&m[mTakeovers])
		}
		for w := 0; w < maxWriters; w++ {
			r := s.writers[w*rowWords : (w+1)*rowWords]
			st.Sets += atomic.LoadInt64(&r[wSets])
			st.Deletes += atomic.LoadInt64(&r[wDeletes])
			st.Corruptions += atomic.LoadInt64(&r[wCorruptions])
			if atomic.LoadInt64(&r[wOwner]) != 0 {
				st.Writers++
			}
		}
		st.CreatedS = float64(atomic.LoadInt64(&s.header[hCreatedNS])) / 1e9
		return nil
	})
	if err != nil {
		s.lost.Store(true)
		return Stats{}, lostErr(c.name, c.path)
	}
	g := s.geo
	st.Name, st.CapacityBytes, st.MaxEntries, st.Memory = c.name, NBuckets*g.Ring, NBuckets*g.MaxLive(), g.Size
	st.Hits, st.Misses, st.ReadRetries = c.hits.Load(), c.misses.Load(), c.retries.Load()
	st.KeySize, st.MaxValue, st.Buckets, st.LayoutVersion, st.CreationID = g.KeySize, g.MaxValue, NBuckets, LayoutVersion, s.creationID
	if t, ok := c.comp.totals(); ok {
		st.ReaderHits, st.ReaderMisses, st.ReaderBatches, st.Readers = t.hits, t.misses, t.batches, t.readers
		st.Corruptions += t.corruptions
		if !c.comp.counting.Load() { // uncounted in the companion: this handle's own corruptions
			st.Corruptions += c.corruptions.Load()
		}
	} else {
		st.Corruptions += c.corruptions.Load()
	}
	return st, nil
}
