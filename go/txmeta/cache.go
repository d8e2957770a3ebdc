package txmeta

import (
	"context"
	"fmt"
	"net/http"
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
	// Hit: found, a txmeta value, within the horizon; its Meta is decoded.
	Hit
	// Old: found, but its block height is below the horizon (Teranode's hit_old_tx): a
	// miss to the caller, counted apart. Its Meta is decoded all the same.
	Old
	// Malformed: found, but not a txmeta value: a miss to the caller, counted apart.
	Malformed
)

var outcomeNames = [...]string{Miss: "miss", Hit: "hit", Old: "old", Malformed: "malformed"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Config is how a Cache reads what it finds.
type Config struct {
	// GlobalBlockHeightRetention is Teranode's setting of that name: the horizon keeps
	// BlocksToKeep(GlobalBlockHeightRetention) blocks below the height SetBlockHeight gave.
	GlobalBlockHeightRetention uint32
}

// percentOfRetention: the horizon keeps a tenth of GlobalBlockHeightRetention, as
// Teranode's txmetacache does (percentageOfGlobalBlockHeightRetentionToKeep).
const percentOfRetention = 10

// BlocksToKeep is the horizon's depth for a GlobalBlockHeightRetention: a tenth of it,
// at least 1 block.
func BlocksToKeep(retention uint32) uint32 {
	if retention < percentOfRetention {
		return 1
	}
	return retention / percentOfRetention
}

// Cache is Teranode's txmeta cache over a shmcache reader: lookups of decoded metadata by
// tx hash, the block-height horizon, health and stats. It only reads; the supervisor
// writes. Safe for concurrent use; each goroutine uses its own Batch and Meta.
type Cache struct {
	r      *shmcache.Cache
	owned  bool // Close closes r
	keep   uint32
	height atomic.Uint32 // the tip SetBlockHeight gave; 0: no horizon yet

	hits, misses, old, malformed atomic.Uint64 // this handle's, as Teranode's metrics are its instance's

	singles sync.Pool // *single, for GetMetaCached
}

type single struct {
	key [HashSize]byte
	b   shmcache.Batch
}

// Attach attaches cache name read-only (shmcache.Attach, with its options, e.g.
// shmcache.WithOwner("shmcache")) and reads it as txmeta.
func Attach(name string, cfg Config, opts ...shmcache.Option) (*Cache, error) {
	r, err := shmcache.Attach(name, opts...)
	if err != nil {
		return nil, err
	}
	c := New(r, cfg)
	c.owned = true
	return c, nil
}

// New reads r, a handle the caller attached, as txmeta; Close leaves r open.
func New(r *shmcache.Cache, cfg Config) *Cache {
	return &Cache{r: r, keep: BlocksToKeep(cfg.GlobalBlockHeightRetention),
		singles: sync.Pool{New: func() any { return new(single) }}}
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
// its target by a live supervisor), or ctx's end with an error saying why it is not.
func (c *Cache) WaitReady(ctx context.Context) error {
	_, err := c.r.WaitReady(ctx)
	return err
}

// SetBlockHeight sets the chain's tip for the horizon: a value whose block height is
// below height - BlocksToKeep is Old. Until it is called (or with a height of at most
// BlocksToKeep) nothing is old. It never fails; the error is Teranode's signature.
func (c *Cache) SetBlockHeight(height uint32) error {
	c.height.Store(height)
	return nil
}

// GetBlockHeight is the tip SetBlockHeight gave last.
func (c *Cache) GetBlockHeight() uint32 { return c.height.Load() }

// BlocksToKeep is the horizon's depth, from Config.GlobalBlockHeightRetention.
func (c *Cache) BlocksToKeep() uint32 { return c.keep }

// isOld is Teranode's horizon rule: a value is old if the tip is above the depth kept and
// the value's height is below tip - keep. A value that carries no height is never old.
func (c *Cache) isOld(m *Meta, tip uint32) bool {
	return m.HasHeight && tip > c.keep && m.BlockHeight < tip-c.keep
}

func (c *Cache) classify(found bool, v []byte, m *Meta, tip uint32) Outcome {
	switch {
	case !found:
		m.Reset()
		return Miss
	case m.decode(v) != "":
		return Malformed
	case c.isOld(m, tip):
		return Old
	}
	return Hit
}

// GetMetaCached looks one tx hash up into m (decoded for Hit and Old). The error is for
// the handle (closed, the cache destroyed or cut short) or ctx's end, never for a miss.
// chainhash.Hash is a [32]byte: pass it as it is. Batches are many times faster a hash.
func (c *Cache) GetMetaCached(ctx context.Context, hash [HashSize]byte, m *Meta) (Outcome, error) {
	if err := ctx.Err(); err != nil {
		return Miss, c.ended(err)
	}
	s := c.singles.Get().(*single)
	defer c.singles.Put(s)
	s.key = hash
	if err := c.r.GetMany(s.key[:], &s.b); err != nil {
		return Miss, err
	}
	o := c.classify(s.b.Has(0), s.b.Value(0), m, c.height.Load())
	c.count(o, 1)
	return o, nil
}

func (c *Cache) count(o Outcome, n uint64) {
	switch o {
	case Hit:
		c.hits.Add(n)
	case Miss:
		c.misses.Add(n)
	case Old:
		c.old.Add(n)
	case Malformed:
		c.malformed.Add(n)
	}
}

// Batch is the result of GetMetaCachedBatch, owned by the caller: reuse one per goroutine
// and nothing is allocated once its buffers have grown to the batch's size and values.
type Batch struct {
	Outcomes []Outcome // per hash, in order
	Metas    []Meta    // per hash: decoded for Hit and Old, reset for Miss and Malformed
	// Counts of the last call's outcomes.
	Hits, Misses, Old, Malformed int
	raw                          shmcache.Batch
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
// Outcome and, for Hit (and Old), its decoded Meta. hashes is []chainhash.Hash or
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
	out.Hits, out.Misses, out.Old, out.Malformed = 0, 0, 0, 0
	tip := c.height.Load()
	for i := range n {
		o := c.classify(out.raw.Has(i), out.raw.Value(i), &out.Metas[i], tip)
		out.Outcomes[i] = o
		switch o {
		case Hit:
			out.Hits++
		case Miss:
			out.Misses++
		case Old:
			out.Old++
		case Malformed:
			out.Malformed++
		}
	}
	c.hits.Add(uint64(out.Hits))
	c.misses.Add(uint64(out.Misses))
	c.old.Add(uint64(out.Old))
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
// once the cache is ready, 503 with why it is not (the reader's Status(): the reason's
// word and its sentence). A handle that cannot read the cache (destroyed, cut short,
// closed) is 503 with the error.
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
	return http.StatusOK, fmt.Sprintf("txmeta cache '%s': ready", c.r.Name()), nil
}

// CacheStats is a snapshot under the names of Teranode's txmetacache: its CacheStats
// fields, and its Prometheus metrics (teranode_tx_meta_cache_NAME) as the JSON names.
// Hits, Misses, HitOldTx and Malformed are this handle's, as Teranode's are its
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
	HitOldTx           uint64 `json:"hit_old_tx"` // found, but below the horizon
	// shmcache's own, with no Teranode name
	Deletes   uint64 `json:"deletes"`   // DELETEs the supervisor applied (Teranode's Delete counts as an eviction)
	Malformed uint64 `json:"malformed"` // found, but not a txmeta value
}

// GetCacheStats reads the cache's counters now; an error only if the handle cannot read
// the cache.
func (c *Cache) GetCacheStats() (*CacheStats, error) {
	st, err := c.r.Stats()
	if err != nil {
		return nil, err
	}
	return &CacheStats{
		EntriesCount: uint64(st.Entries), TotalMapSize: uint64(st.Entries),
		TotalElementsAdded: uint64(st.Sets), Insertions: uint64(st.Sets), Evictions: uint64(st.Evictions),
		Hits: c.hits.Load(), Misses: c.misses.Load(), HitOldTx: c.old.Load(),
		Deletes: uint64(st.Deletes), Malformed: c.malformed.Load(),
	}, nil
}

// ended is ctx's end as the reader's errors are (docs/go.md, Errors): a *shmcache.Error of
// kind not-ready (shmcache.Kind says so, errors.Is(err, shmcache.ErrNotReady) holds) whose
// cause is the context's error (errors.Is(err, context.Canceled), or DeadlineExceeded).
func (c *Cache) ended(err error) error {
	return &shmcache.Error{Cache: c.r.Name(), Kind: shmcache.ErrNotReady, Err: err,
		Detail: fmt.Sprintf("txmeta: the context ended before the lookup: %v", err)}
}
