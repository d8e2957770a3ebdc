package txmeta

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	shmcache "github.com/shmcache/shmcache/go"
)

// BatchSize is how many hashes subtree validation looks up at a time
// (processTxMetaUsingCache's batch); any number may be given.
const BatchSize = 1024

// Outcome is what a lookup found for one hash.
type Outcome uint8

const (
	// Miss: not in the cache (never written, deleted, or evicted). The caller asks the
	// store of record, as after a miss of Teranode's GetMetaCached.
	Miss Outcome = iota
	// Hit: found, a txmeta value; its Meta is decoded.
	Hit
	// Malformed: found, but not a txmeta value: a miss to the caller, counted apart.
	Malformed
)

var outcomeNames = [...]string{Miss: "miss", Hit: "hit", Malformed: "malformed"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Cache is Teranode's txmeta cache over a shmcache reader: lookups of decoded metadata by
// tx hash, health and stats. It only reads; the supervisor writes. Safe for concurrent
// use; each goroutine uses its own Batch and Meta.
//
// It has no block-height horizon: Teranode's in-process cache appends its own tip to a
// value when it caches it, and the txmeta topic carries none, so on a cache filled from
// the topic no value could ever be below one (docs/teranode.md, "No horizon").
type Cache struct {
	r     *shmcache.Cache
	owned bool // Close closes r

	hits, misses, malformed atomic.Uint64 // this handle's, as Teranode's metrics are its instance's

	singles sync.Pool // *single, for Lookup and GetMetaCached

	limits atomic.Pointer[[]shmcache.Limit] // Health's readiness bound (SetReadyLimits)
}

type single struct {
	key [HashSize]byte
	b   shmcache.Batch
}

// Attach attaches cache name read-only (shmcache.Attach, with its options, e.g.
// shmcache.WithOwner("shmcache")) and reads it as txmeta.
func Attach(name string, opts ...shmcache.Option) (*Cache, error) {
	r, err := shmcache.Attach(name, opts...)
	if err != nil {
		return nil, err
	}
	c := New(r)
	c.owned = true
	return c, nil
}

// New reads r, a handle the caller attached, as txmeta; Close leaves r open.
func New(r *shmcache.Cache) *Cache {
	return &Cache{r: r, singles: sync.Pool{New: func() any { return new(single) }}}
}

// Reader is the shmcache handle underneath (its Stats, Status, GetMany).
func (c *Cache) Reader() *shmcache.Cache { return c.r }

// Name is the cache's name.
func (c *Cache) Name() string { return c.r.Name() }

// Close closes the handle if Attach made it. It never destroys the cache. Close of a nil
// *Cache (what a failed Attach returned) does nothing, as the reader's Close.
func (c *Cache) Close() error {
	if c == nil {
		return nil
	}
	if c.owned {
		return c.r.Close()
	}
	return nil
}

// WaitReady returns once the cache holds the whole topic (every partition applied up to
// its target by a live supervisor) and is within the limits given (shmcache.MaxLag,
// shmcache.MaxBehind), or ctx's end with an error saying why it is not.
func (c *Cache) WaitReady(ctx context.Context, limit ...shmcache.Limit) error {
	_, err := c.r.WaitReady(ctx, limit...)
	return err
}

// SetReadyLimits bounds how far behind its topic Health's readiness lets the cache be:
// Health(ctx, false) is 503 while a partition is more than shmcache.MaxLag messages or
// shmcache.MaxBehind behind, though the cache is ready. None given: no bound (the
// default). Safe to call while others call Health.
func (c *Cache) SetReadyLimits(limit ...shmcache.Limit) {
	l := slices.Clone(limit)
	c.limits.Store(&l)
}

func classify(found bool, v []byte, m *Meta) Outcome {
	switch {
	case !found:
		m.Reset()
		return Miss
	case m.decode(v) != "":
		return Malformed
	}
	return Hit
}

// Lookup looks one tx hash up into m (decoded for a Hit), allocating nothing once m has
// grown. The error is for the handle (closed, the cache destroyed or cut short) or ctx's
// end, never for a miss. chainhash.Hash is a [32]byte: pass it as it is. Batches
// (GetMetaCachedBatch) are many times faster a hash.
func (c *Cache) Lookup(ctx context.Context, hash [HashSize]byte, m *Meta) (Outcome, error) {
	s, err := c.one(ctx, hash)
	if err != nil {
		return Miss, err
	}
	defer c.singles.Put(s)
	o := classify(s.b.Has(0), s.b.Value(0), m)
	c.count(o, 1)
	return o, nil
}

// GetMetaCached is Teranode's call, with its results: the decoded metadata of a hit (a new
// Meta: the caller keeps it), nil and a nil error for a miss, nil and a *MalformedError
// for a value that is not txmeta (errors.Is(err, ErrMalformed)), nil and the reader's
// error when the handle cannot read the cache or ctx is done. Subtree validation's loop
// (processTxMetaUsingCache) counts every nil as a miss and logs the errors, as it does
// with its own cache's.
func (c *Cache) GetMetaCached(ctx context.Context, hash [HashSize]byte) (*Meta, error) {
	s, err := c.one(ctx, hash)
	if err != nil {
		return nil, err
	}
	defer c.singles.Put(s)
	if !s.b.Has(0) {
		c.count(Miss, 1)
		return nil, nil
	}
	m := new(Meta)
	if err := m.Decode(s.b.Value(0)); err != nil {
		c.count(Malformed, 1)
		return nil, err
	}
	c.count(Hit, 1)
	return m, nil
}

// one looks hash up into a pooled single (the caller puts it back), or ctx's end or the
// reader's error.
func (c *Cache) one(ctx context.Context, hash [HashSize]byte) (*single, error) {
	if err := ctx.Err(); err != nil {
		return nil, c.ended(err)
	}
	s := c.singles.Get().(*single)
	s.key = hash
	if err := c.r.GetMany(s.key[:], &s.b); err != nil {
		c.singles.Put(s)
		return nil, err
	}
	return s, nil
}

func (c *Cache) count(o Outcome, n uint64) {
	switch o {
	case Hit:
		c.hits.Add(n)
	case Miss:
		c.misses.Add(n)
	case Malformed:
		c.malformed.Add(n)
	}
}

// Batch is the result of GetMetaCachedBatch, owned by the caller: reuse one per goroutine
// and nothing is allocated once its buffers have grown to the batch's size and values.
type Batch struct {
	Outcomes []Outcome // per hash, in order
	Metas    []Meta    // per hash: decoded for Hit, reset for Miss and Malformed
	// Counts of the last call's outcomes.
	Hits, Misses, Malformed int
	raw                     shmcache.Batch
}

// Len is the number of hashes of the last call.
func (b *Batch) Len() int { return len(b.Outcomes) }

// Meta is hash i's metadata if it was a Hit, else nil. It is b's, until the next call.
func (b *Batch) Meta(i int) *Meta {
	if b.Outcomes[i] != Hit {
		return nil
	}
	return &b.Metas[i]
}

// Keys is hashes as shmcache's GetMany takes keys, 32 bytes each back to back, without a
// copy: a [32]byte has no padding and a slice's elements are contiguous, so the n hashes
// already are those n*32 bytes. The view shares the hashes' memory (read, never written,
// by a lookup) and keeps it alive while it is used.
func Keys[H ~[HashSize]byte](hashes []H) []byte {
	if len(hashes) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(hashes))), len(hashes)*HashSize)
}

// GetMetaCachedBatch looks hashes up into out, in one call to the reader: for each its
// Outcome and, for a Hit, its decoded Meta. hashes is []chainhash.Hash or
// [][32]byte as it is, never copied. The error is for the whole call: ctx's end, the
// handle closed, the cache destroyed or cut short.
func GetMetaCachedBatch[H ~[HashSize]byte](ctx context.Context, c *Cache, hashes []H, out *Batch) error {
	return c.getBatch(ctx, Keys(hashes), out)
}

func (c *Cache) getBatch(ctx context.Context, keys []byte, out *Batch) error {
	if err := ctx.Err(); err != nil {
		return c.ended(err)
	}
	if err := c.r.GetMany(keys, &out.raw); err != nil {
		return err
	}
	n := out.raw.Len()
	out.Outcomes = grow(out.Outcomes, n)
	out.Metas = growMetas(out.Metas, n)
	out.Hits, out.Misses, out.Malformed = 0, 0, 0
	for i := range n {
		o := classify(out.raw.Has(i), out.raw.Value(i), &out.Metas[i])
		out.Outcomes[i] = o
		switch o {
		case Hit:
			out.Hits++
		case Miss:
			out.Misses++
		case Malformed:
			out.Malformed++
		}
	}
	c.hits.Add(uint64(out.Hits))
	c.misses.Add(uint64(out.Misses))
	c.malformed.Add(uint64(out.Malformed))
	return nil
}

// growMetas keeps the Metas already made, with their buffers.
func growMetas(s []Meta, n int) []Meta {
	if cap(s) >= n {
		return s[:n]
	}
	t := make([]Meta, n)
	copy(t, s[:cap(s)])
	return t
}

// Health is Teranode's health check of a store. checkLiveness: 200 while the handle reads
// the cache (its control area answers), whatever the readiness. Otherwise readiness: 200
// once the cache is ready and within SetReadyLimits' bound, 503 with why it is not (the
// reader's Status(): the reason's word and its sentence; or the partitions past the
// bound). A handle that cannot read the cache (destroyed, cut short, closed) is 503 with
// the error.
func (c *Cache) Health(ctx context.Context, checkLiveness bool) (int, string, error) {
	if err := ctx.Err(); err != nil {
		err = c.ended(err)
		return http.StatusServiceUnavailable, err.Error(), err
	}
	st, err := c.r.Status()
	switch {
	case err != nil:
		return http.StatusServiceUnavailable, err.Error(), err
	case checkLiveness:
		return http.StatusOK, fmt.Sprintf("txmeta cache '%s': attached", c.r.Name()), nil
	case !st.Ready:
		return http.StatusServiceUnavailable, fmt.Sprintf("txmeta cache '%s': not ready (%s): %s", c.r.Name(),
			st.Reason, st.Why), nil
	}
	if l := c.limits.Load(); l != nil {
		if over := st.Beyond(*l...); over != "" {
			return http.StatusServiceUnavailable, fmt.Sprintf("txmeta cache '%s': ready, but behind: %s",
				c.r.Name(), over), nil
		}
	}
	return http.StatusOK, fmt.Sprintf("txmeta cache '%s': ready", c.r.Name()), nil
}

// CacheStats is a snapshot under the names of Teranode's txmetacache: the fields of its
// CacheStats (EntriesCount, TrimCount, TotalMapSize, TotalElementsAdded, at the commit
// docs/teranode.md names), and its Prometheus metrics (teranode_tx_meta_cache_NAME) as the
// JSON names. Hits, Misses and Malformed are this handle's, as Teranode's are its
// instance's; the rest is the whole cache's, from the shared segment.
type CacheStats struct {
	EntriesCount       uint64 `json:"size"`                 // live entries
	TrimCount          uint64 `json:"trims"`                // always 0: nothing trims a shmcache
	TotalMapSize       uint64 `json:"map_size"`             // index slots in use: one a live entry
	TotalElementsAdded uint64 `json:"total_elements_added"` // sets by the supervisor's workers since creation
	Insertions         uint64 `json:"insertions"`           // the same sets: only the supervisor inserts
	Evictions          uint64 `json:"evictions"`            // entries overwritten for room
	Hits               uint64 `json:"hits"`
	Misses             uint64 `json:"misses"`
	// shmcache's own, with no Teranode name
	Deletes   uint64 `json:"deletes"`   // DELETEs the supervisor applied (Teranode's Delete counts as an eviction)
	Malformed uint64 `json:"malformed"` // found, but not a txmeta value
}

// Stats reads the cache's counters now; an error only if the handle cannot read the cache.
func (c *Cache) Stats() (*CacheStats, error) {
	st, err := c.r.Stats()
	if err != nil {
		return nil, err
	}
	return &CacheStats{
		EntriesCount: uint64(st.Entries), TotalMapSize: uint64(st.Entries),
		TotalElementsAdded: uint64(st.Sets), Insertions: uint64(st.Sets), Evictions: uint64(st.Evictions),
		Hits: c.hits.Load(), Misses: c.misses.Load(), Deletes: uint64(st.Deletes), Malformed: c.malformed.Load(),
	}, nil
}

// GetCacheStats is Teranode's call, with its result: Stats, where a cache the handle
// cannot read (destroyed, cut short, the handle closed) gives 0 for the whole cache's
// counts, and this handle's counts as ever. Health says why; Stats returns the error.
func (c *Cache) GetCacheStats() *CacheStats {
	if st, err := c.Stats(); err == nil {
		return st
	}
	return &CacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Malformed: c.malformed.Load()}
}

// ended is ctx's end as the reader's errors are (docs/go.md, Errors): a *shmcache.Error of
// kind not-ready (shmcache.Kind says so, errors.Is(err, shmcache.ErrNotReady) holds) whose
// cause is the context's error (errors.Is(err, context.Canceled), or DeadlineExceeded).
func (c *Cache) ended(err error) error {
	return &shmcache.Error{Cache: c.r.Name(), Kind: shmcache.ErrNotReady, Err: err,
		Detail: fmt.Sprintf("txmeta: the context ended before the lookup: %v", err)}
}
