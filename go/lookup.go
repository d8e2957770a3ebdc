package shmcache

// Lookups (docs/segment-format.md, sections 7-11). A reader takes no lock and writes
// nothing to the cache: each key's bucket is read between two loads of its seqlock
// version and the read kept only if the version was even (or is a dead writer's, or
// damage, accepted as it stands) and did not move. Every read is bounded by the
// geometry read at attach: an index slot's offset is used only if it is a record's, a
// record only if its length fits, so no byte pattern makes a read leave the mapping. A
// damaged slot or record is a miss and a counted corruption, never an error.

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// Batch is the result of GetMany: reuse one across calls and nothing is allocated per
// key once its buffers have grown to the batch's size.
type Batch struct {
	Data        []byte   // the values found, back to back
	Offsets     []int    // value i is Data[Offsets[i]:Offsets[i+1]] (n+1 entries)
	Found       []uint64 // bit i%64 of word i/64: key i was found
	Retries     int64    // seqlock retries in this call (a writer was changing a bucket)
	Corruptions int64    // damaged slots or records, and buckets given up, met in this call
	hashes      []uint64
	givenUp     []int64
	sink        int64
}

// Len is the number of keys of the last call.
func (b *Batch) Len() int { return len(b.Offsets) - 1 }

// Has says whether key i was found.
func (b *Batch) Has(i int) bool { return b.Found[i>>6]&(1<<(uint(i)&63)) != 0 }

// Value is key i's value (a view of Data, valid until the next call), nil if not found;
// an empty value found is an empty slice, not nil.
func (b *Batch) Value(i int) []byte {
	if !b.Has(i) {
		return nil
	}
	return b.Data[b.Offsets[i]:b.Offsets[i+1]:b.Offsets[i+1]]
}

// Hits is how many keys of the last call were found.
func (b *Batch) Hits() int {
	n := 0
	for _, w := range b.Found {
		n += bits.OnesCount64(w)
	}
	return n
}

func (b *Batch) reset(n int) {
	if b.Data == nil {
		b.Data = make([]byte, 0, 64) // never nil: a view of it is a value, even an empty one
	}
	b.Data = b.Data[:0]
	b.Offsets = grow(b.Offsets, n+1)
	b.Offsets[0] = 0
	b.Found = grow(b.Found, (n+63)/64)
	clear(b.Found)
	b.hashes = grow(b.hashes, n)
	b.givenUp = b.givenUp[:0]
	b.Retries, b.Corruptions = 0, 0
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

var batches = sync.Pool{New: func() any { return new(Batch) }}

// GetMany looks up n keys given back to back in keys (n * key size bytes) and writes the
// values into out. An error is for the whole call: a closed handle, keys of the wrong
// size or no out (ErrBadArgument), a cache destroyed, replaced or cut short under the
// handle. Buckets held mid-write cost the call at most StuckGiveUpNS in all.
func (c *Cache) GetMany(keys []byte, out *Batch) error { return c.lookup(keys, nil, out, true) }

// GetManyKeys is GetMany for keys given as a slice of slices.
func (c *Cache) GetManyKeys(keys [][]byte, out *Batch) error { return c.lookup(nil, keys, out, true) }

// ContainsMany is GetMany without copying values: out.Found says which keys are present.
func (c *Cache) ContainsMany(keys []byte, out *Batch) error { return c.lookup(keys, nil, out, false) }

// Get looks one key up: its value (a copy), whether it was found, and an error for the
// handle (see GetMany). Batches are many times faster per key.
func (c *Cache) Get(key []byte) ([]byte, bool, error) {
	b := batches.Get().(*Batch)
	defer batches.Put(b)
	if err := c.lookup(key, nil, b, true); err != nil {
		return nil, false, err
	}
	if !b.Has(0) {
		return nil, false, nil
	}
	return bytes.Clone(b.Value(0)), true, nil
}

// Contains says whether one key is present.
func (c *Cache) Contains(key []byte) (bool, error) {
	b := batches.Get().(*Batch)
	defer batches.Put(b)
	if err := c.lookup(key, nil, b, false); err != nil {
		return false, err
	}
	return b.Has(0), nil
}

func (c *Cache) lookup(flat []byte, list [][]byte, out *Batch, want bool) (err error) {
	if out == nil {
		return newErr(c.name, ErrBadArgument, "no Batch to write the answers into (out is nil)")
	}
	s, err := c.acquire()
	if err != nil {
		return err
	}
	defer c.mu.RUnlock()
	ks := int(s.geo.KeySize)
	n := len(list)
	if list == nil {
		if len(flat)%ks != 0 {
			return newErr(c.name, ErrKeySize, "keys are %d bytes, not a whole number of %d-byte keys", len(flat), ks)
		}
		n = len(flat) / ks
	} else {
		for i, k := range list {
			if len(k) != ks {
				return newErr(c.name, ErrKeySize, "key %d is %d bytes; this cache's keys are %d", i, len(k), ks)
			}
		}
	}
	out.reset(n)
	keyAt := func(i int) []byte {
		if list != nil {
			return list[i]
		}
		return flat[i*ks : i*ks+ks]
	}
	for i := range n {
		out.hashes[i] = xxhash.Sum64(keyAt(i))
	}
	defer guard(debug.SetPanicOnFault(true), s, c.name, c.path, &err)
	var sink int64
	span := recordHead + int64(ks)
	if want {
		span += c.valueGuess.Load() // the mean value length met so far (a guess of what to fetch)
	}
	staticB, staticV := int64(-1), int64(-1)
	var deadline int64 // the call's one wait on stuck buckets ends here; 0: none met yet (section 7)
	group := func(g int) []uint64 { return out.hashes[min(n, g*touchGroup):min(n, (g+1)*touchGroup)] }
	if havePrefetch {
		for j := range min(n, aheadBucket) {
			s.prefetchBucket(out.hashes[j])
		}
		for j := range min(n, aheadRecord) {
			s.prefetchRecord(out.hashes[j], span)
		}
	} else {
		sink += s.touchBuckets(group(0)) + s.touchBuckets(group(1)) + s.touchRecords(group(0), span)
	}
	for i := range n {
		if havePrefetch { // a software pipeline: buckets aheadBucket keys ahead, records aheadRecord
			if i+aheadBucket < n {
				s.prefetchBucket(out.hashes[i+aheadBucket])
			}
			if i+aheadRecord < n {
				s.prefetchRecord(out.hashes[i+aheadRecord], span)
			}
		} else if i%touchGroup == 0 { // three stages: buckets two groups ahead, records one
			g := i / touchGroup
			sink += s.touchBuckets(group(g+2)) + s.touchRecords(group(g+1), span)
		}
		h := out.hashes[i]
		b := int64(h & (NBuckets - 1))
		found := false
		for {
			st, hit := s.readKey(h, keyAt(i), out, want, staticB, staticV)
			if st == readDone {
				found = hit
				break
			}
			now := monotonicNS()
			if deadline == 0 {
				deadline = now + StuckGiveUpNS
			}
			if contains(out.givenUp, b) || now >= deadline { // every call returns in one bound
				if !contains(out.givenUp, b) {
					out.givenUp = append(out.givenUp, b)
				}
				c.warn(b, "bucket %d stayed mid-write or kept changing while this call waited 1 s in all on "+
					"stuck buckets; its keys are reported missing for this call", b)
				out.Corruptions++ // the key: a miss
				break
			}
			staticB, staticV = c.stuckBucket(s, b, staticB, staticV, out)
		}
		if found {
			out.Found[i>>6] |= 1 << (uint(i) & 63)
		}
		out.Offsets[i+1] = len(out.Data)
	}
	out.sink = sink // keeps the prefetching loads
	hits := int64(out.Hits())
	if want && hits > 0 {
		c.valueGuess.Store(min(int64(len(out.Data))/hits+1, s.geo.MaxValue))
	}
	c.hits.Add(hits)
	c.misses.Add(int64(n) - hits)
	c.retries.Add(out.Retries)
	c.corruptions.Add(out.Corruptions)
	c.comp.add(hits, int64(n)-hits, out.Retries, out.Corruptions)
	return nil
}

func contains(s []int64, v int64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

const (
	readDone  = 0
	readStuck = 1
)

// readKey reads one key under its bucket's seqlock, appending its value to out.Data when
// want; readStuck when the version stayed odd or kept moving for SpinLimit loads.
func (s *segment) readKey(h uint64, key []byte, out *Batch, want bool, staticB, staticV int64) (int, bool) {
	b := int64(h & (NBuckets - 1))
	ver := &s.meta[b*rowWords+mVersion]
	pos := len(out.Data)
	for spins := 0; ; {
		v1 := atomic.LoadInt64(ver)
		if v1&1 != 0 && !(b == staticB && v1 == staticV) {
			if spins++; spins >= SpinLimit {
				return readStuck, false
			}
			continue
		}
		hit, vlen, bad := s.probe(h, b, key)
		if want && hit >= 0 {
			out.Data = append(out.Data, s.ring[hit:hit+vlen]...)
		}
		loadFence(&out.sink)
		if atomic.LoadInt64(ver) == v1 {
			if bad && v1&1 == 0 {
				out.Corruptions++
			}
			return readDone, hit >= 0
		}
		out.Data = out.Data[:pos]
		out.Retries++
		if spins++; spins >= SpinLimit {
			return readStuck, false
		}
	}
}

// probe walks the key's probe path (sections 9-11): the ring offset of its value and its
// length, or -1; bad if a slot of its tag or a record of its hash was damaged.
func (s *segment) probe(h uint64, b int64, key []byte) (hit, vlen int64, bad bool) {
	slots, ring, ks, maxv := s.geo.Slots, s.geo.Ring, s.geo.KeySize, s.geo.MaxValue
	lim := uint64(ring - recordHead - ks) // a record header and key fit from an offset <= lim
	mask := slots - 1
	ibase, rbase := b*slots, b*ring
	tag := int64(h >> tagShift)
	idx := s.index[ibase : ibase+slots]
	sl := int64(h>>bucketBits) & mask
	for range slots {
		e := idx[sl]
		if e == 0 {
			break
		}
		if e>>posBits == tag {
			off := e&posMask - 1
			if uint64(off) > lim || off&(recordAlign-1) != 0 {
				bad = true
			} else if p := rbase + off; binary.LittleEndian.Uint64(s.ring[p:]) == h {
				w := binary.LittleEndian.Uint64(s.ring[p+8:])
				ln := int64(w & 0xFFFFFFFF)
				if int64(w)>>32 != fLive || ln > maxv || off+recordHead+ks+ln > ring {
					bad = true
				} else if k := p + recordHead; bytes.Equal(s.ring[k:k+ks], key) {
					return k + ks, ln, bad
				}
			}
		}
		sl = (sl + 1) & mask
	}
	return -1, 0, bad
}

// stuckBucket decides what to do with a bucket that stayed mid-write (section 7, step 5):
// accept its odd version as it stands (damage: no lock holder; or a dead holder), or
// yield and let the caller read again.
func (c *Cache) stuckBucket(s *segment, b, staticB, staticV int64, out *Batch) (int64, int64) {
	ver, lock := &s.meta[b*rowWords+mVersion], &s.meta[b*rowWords+mLock]
	v := atomic.LoadInt64(ver)
	owner := atomic.LoadInt64(lock)
	if v&1 != 0 && atomic.LoadInt64(ver) == v {
		if owner == 0 {
			if b != staticB || v != staticV {
				out.Corruptions++
				c.warn(b, "bucket %d is mid-write (version %d) with no writer holding its lock: damage, read as it "+
					"stands", b, v)
			}
			return b, v
		}
		// only while the dead writer still holds the lock is that odd version its own
		if !IsAlive(owner) && atomic.LoadInt64(lock) == owner {
			return b, v
		}
	}
	runtime.Gosched() // a live writer is mid-write (or just finished): read again
	return staticB, staticV
}

func (c *Cache) warn(b int64, format string, args ...any) {
	if c.Logf == nil {
		return
	}
	if _, seen := c.warned.LoadOrStore(b, true); !seen {
		c.Logf("shmcache: cache '%s': "+format, append([]any{c.name}, args...)...)
	}
}
