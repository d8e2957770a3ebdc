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
	"math/bits"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
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
	givenUp     []int64                // the buckets given up in this call, in the order met
	givenBits   *[NBuckets / 64]uint64 // the same as bits (made at the first give-up), cleared at reset
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
	for _, g := range b.givenUp {
		b.givenBits[g>>6] = 0
	}
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
	one := [1][]byte{key} // one key of the cache's size: never a longer key read as several
	if err := c.lookup(nil, one[:], b, true); err != nil {
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
	one := [1][]byte{key}
	if err := c.lookup(nil, one[:], b, false); err != nil {
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
	if n == 0 {
		c.count(out, 0, 0)
		return nil
	}
	hashKeys(flat, list, ks, out.hashes)
	defer guard(debug.SetPanicOnFault(true), s, c.name, c.path, &err)
	t := &s.tab
	span := recordHead + int64(ks)
	if want {
		span += c.valueGuess.Load() // the mean value length met so far (a guess of what to fetch)
	}
	hashes := out.hashes[:n]
	var sink int64
	groups := (n + aheadGroup - 1) / aheadGroup
	for g := range min(groups, aheadBuckets) {
		sink += t.ahead(hashes, g, -1, span)
	}
	for g := range min(groups, aheadRecords) {
		sink += t.ahead(hashes, -1, g, span)
	}
	var keys unsafe.Pointer
	if list == nil {
		keys = unsafe.Pointer(unsafe.SliceData(flat))
	}
	ends := out.Offsets[1 : n+1]
	st := stuck{b: -1, v: -1}
	var found64 uint64 // bit i%64: key i was found, stored in out.Found each 64 keys
	for i, h := range hashes {
		if i%aheadGroup == 0 { // a software pipeline: buckets aheadBuckets groups ahead, records aheadRecords
			g := i / aheadGroup
			sink += t.ahead(hashes, g+aheadBuckets, g+aheadRecords, span)
		}
		var key unsafe.Pointer // ks bytes
		if list != nil {
			key = unsafe.Pointer(unsafe.SliceData(list[i]))
		} else {
			key = unsafe.Add(keys, i*ks)
		}
		// the read of section 7 as it nearly always goes: an even version, the probe and the
		// copy, the same version again; anything else is readStuck's, from its step 1
		ver := &t.meta[h&(NBuckets-1)*rowWords+mVersion]
		found, done := false, false
		if v1 := atomic.LoadInt64(ver); v1&1 == 0 {
			pos := len(out.Data)
			hit, vlen, bad := t.probe(h, key)
			if want && hit >= 0 {
				out.Data = append(out.Data, t.bytes(hit, vlen)...)
			}
			loadFence(&out.sink)
			if atomic.LoadInt64(ver) == v1 {
				if bad {
					out.Corruptions++
				}
				found, done = hit >= 0, true
			} else {
				out.Data = out.Data[:pos]
				out.Retries++
			}
		}
		if !done {
			found = c.readStuck(t, h, key, out, want, &st)
		}
		if found {
			found64 |= 1 << (uint(i) & 63)
		}
		if i&63 == 63 {
			out.Found[i>>6] = found64
			found64 = 0
		}
		ends[i] = len(out.Data)
	}
	if n&63 != 0 {
		out.Found[n>>6] = found64
	}
	out.sink = sink // keeps the touching loads
	if len(out.givenUp) > 0 {
		c.warnGivenUp(out.givenUp)
	}
	hits := int64(out.Hits())
	if want && hits > 0 {
		c.valueGuess.Store(min(int64(len(out.Data))/hits+1, s.geo.MaxValue))
	}
	c.count(out, int64(n), hits)
	return nil
}

// count adds a call's outcome to the handle's counters and the companion's row.
func (c *Cache) count(out *Batch, n, hits int64) {
	c.hits.Add(hits)
	c.misses.Add(n - hits)
	c.retries.Add(out.Retries)
	c.corruptions.Add(out.Corruptions)
	c.comp.add(hits, n-hits, out.Retries, out.Corruptions)
}

// stuck is a call's state of section 7, step 5: the bucket accepted as it stands at an odd
// version (b, v; -1 none) and the deadline of the call's one wait on stuck buckets (0:
// none met yet).
type stuck struct {
	b, v     int64
	deadline int64
}

// readStuck reads a key whose first read under the seqlock failed (an odd version, or one
// that moved): again from step 1 (its first load already spent), and through step 5 for
// as long as its bucket stays stuck, within the call's one bound; found or not.
func (c *Cache) readStuck(t *table, h uint64, key unsafe.Pointer, out *Batch, want bool, st *stuck) bool {
	b := int64(h & (NBuckets - 1))
	spins := 1
	for {
		// every call returns in one bound: past it, a key whose first read failed is given
		// up at once, before any spin on its bucket or look at its writer (200,000 keys over
		// held buckets were 3.3 s of such spins and of a linear search of the given-up list)
		if st.deadline != 0 && (out.givenBits != nil && out.givenBits[b>>6]&(1<<(b&63)) != 0 ||
			monotonicNS() >= st.deadline) {
			out.giveUp(b)
			return false
		}
		rs, hit := t.readKey(h, key, out, want, st.b, st.v, spins)
		if rs == readDone {
			return hit
		}
		spins = 0
		if st.deadline == 0 {
			st.deadline = monotonicNS() + StuckGiveUpNS
		}
		st.b, st.v = c.stuckBucket(t, b, st.b, st.v, out)
	}
}

// giveUp counts key of bucket b given up in this call: a miss, one corruption.
func (out *Batch) giveUp(b int64) {
	if out.givenBits == nil {
		out.givenBits = new([NBuckets / 64]uint64)
	}
	if out.givenBits[b>>6]&(1<<(b&63)) == 0 {
		out.givenBits[b>>6] |= 1 << (b & 63)
		out.givenUp = append(out.givenUp, b)
	}
	out.Corruptions++
}

const (
	readDone  = 0
	readStuck = 1
)

// readKey reads one key under its bucket's seqlock (section 7, steps 1-4), appending its
// value to out.Data when want; readStuck when the version stayed odd or kept moving for
// SpinLimit loads, spins of them spent before the call.
func (t *table) readKey(h uint64, key unsafe.Pointer, out *Batch, want bool, staticB, staticV int64, spins int) (int, bool) {
	b := int64(h & (NBuckets - 1))
	ver := &t.meta[b*rowWords+mVersion]
	pos := len(out.Data)
	for {
		v1 := atomic.LoadInt64(ver)
		if v1&1 != 0 && !(b == staticB && v1 == staticV) {
			if spins++; spins >= SpinLimit {
				return readStuck, false
			}
			continue
		}
		hit, vlen, bad := t.probe(h, key)
		if want && hit >= 0 {
			out.Data = append(out.Data, t.bytes(hit, vlen)...)
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

// table is what a lookup reads of a mapping: the bucket meta rows, and the index and the
// rings as base addresses, with the geometry read at attach. A lookup reads them through
// unsafe pointers, each address bounded as its use says (probe, ahead): the bucket from
// the hash's low bits (< NBuckets), a slot from its probe position (< slots), a record
// from an offset checked against the ring; Go's own bounds checks would only repeat
// these, once per word read.
type table struct {
	meta  *[NBuckets * rowWords]int64
	index unsafe.Pointer // NBuckets * slots words
	ring  unsafe.Pointer // NBuckets * ring bytes
	slots int64
	rsize int64 // ring bytes a bucket
	ks    int64
	maxv  int64
	lim   int64 // a record header and key fit in the ring from an offset <= lim

	writerAlive func(int64) bool // whether a bucket lock's holder runs (segment.writerAlive)
}

func newTable(s *segment) table {
	return table{meta: s.meta, index: unsafe.Pointer(unsafe.SliceData(s.index)),
		ring: unsafe.Pointer(unsafe.SliceData(s.ring)), slots: s.geo.Slots, rsize: s.geo.Ring,
		ks: s.geo.KeySize, maxv: s.geo.MaxValue, lim: s.geo.Ring - recordHead - s.geo.KeySize,
		writerAlive: s.writerAlive}
}

// slot is word sl (< slots) of bucket b's index row.
func (t *table) slot(b, sl int64) int64 {
	return *(*int64)(unsafe.Add(t.index, (b*t.slots+sl)*word))
}

// ringWord is the word at offset p of the rings (p + 8 <= NBuckets * ring).
func (t *table) ringWord(p int64) uint64 { return *(*uint64)(unsafe.Add(t.ring, p)) }

// bytes is [p, p+n) of the rings (inside them).
func (t *table) bytes(p, n int64) []byte { return unsafe.Slice((*byte)(unsafe.Add(t.ring, p)), n) }

// probe walks the key's probe path (sections 9-11): the offset in the rings of its value
// and its length, or -1; bad if a slot of its tag or a record of its hash was damaged.
// Every read is inside the key's bucket: a slot at its probe position (masked to the
// bucket's slots), a record's header and key only from an offset <= lim (a multiple of
// RECORD_ALIGN), its value only when it ends inside the ring.
func (t *table) probe(h uint64, key unsafe.Pointer) (hit, vlen int64, bad bool) {
	mask := t.slots - 1
	b := int64(h & (NBuckets - 1))
	base := b * t.rsize
	tag := int64(h >> tagShift)
	sl := int64(h>>bucketBits) & mask
	for range t.slots {
		e := t.slot(b, sl)
		if e == 0 {
			break
		}
		if e>>posBits == tag {
			off := e&posMask - 1
			if uint64(off) > uint64(t.lim) || off&(recordAlign-1) != 0 {
				bad = true
			} else if p := base + off; t.ringWord(p) == h {
				w := t.ringWord(p + 8)
				ln := int64(w & 0xFFFFFFFF)
				if int64(w)>>32 != fLive || ln > t.maxv || off+recordHead+t.ks+ln > t.rsize {
					bad = true
				} else if k := p + recordHead; t.keyEqual(k, key) {
					return k + t.ks, ln, bad
				}
			}
		}
		sl = (sl + 1) & mask
	}
	return -1, 0, bad
}

// keyEqual compares the key at offset p of the rings with key (ks bytes each): a 32-byte
// key as four words.
func (t *table) keyEqual(p int64, key unsafe.Pointer) bool {
	r := unsafe.Add(t.ring, p)
	if t.ks == 32 {
		a, b := (*[4]uint64)(r), (*[4]uint64)(key)
		return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3]
	}
	return bytes.Equal(unsafe.Slice((*byte)(r), t.ks), unsafe.Slice((*byte)(key), t.ks))
}

// stuckBucket decides what to do with a bucket that stayed mid-write (section 7, step 5):
// accept its odd version as it stands (damage: no lock holder; or a dead holder), or
// yield and let the caller read again.
func (c *Cache) stuckBucket(t *table, b, staticB, staticV int64, out *Batch) (int64, int64) {
	ver, lock := &t.meta[b*rowWords+mVersion], &t.meta[b*rowWords+mLock]
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
		if !t.writerAlive(owner) && atomic.LoadInt64(lock) == owner {
			return b, v
		}
	}
	runtime.Gosched() // a live writer is mid-write (or just finished): read again
	return staticB, staticV
}

// warnGivenUp logs, in one line a call, the buckets given up in it that this handle had not
// logged before (the first 8 named), as the Python and Java readers word it.
func (c *Cache) warnGivenUp(buckets []int64) {
	if c.Logf == nil {
		return
	}
	var fresh []string
	n := 0
	for _, b := range buckets {
		if _, seen := c.warned.LoadOrStore(b, true); !seen {
			if n++; n <= 8 {
				fresh = append(fresh, strconv.FormatInt(b, 10))
			}
		}
	}
	if n == 0 {
		return
	}
	more := ""
	if n > 8 {
		more = ", ..."
	}
	c.Logf("shmcache: cache '%s': %d bucket(s) stayed mid-write or kept changing for 1 s (%s%s); their keys are "+
		"reported missing for this call", c.name, n, strings.Join(fresh, ", "), more)
}

func (c *Cache) warn(b int64, format string, args ...any) {
	if c.Logf == nil {
		return
	}
	if _, seen := c.warned.LoadOrStore(b, true); !seen {
		c.Logf("shmcache: cache '%s': "+format, append([]any{c.name}, args...)...)
	}
}
