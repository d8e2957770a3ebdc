package shmcache

import (
	"encoding/binary"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
)

// Geometry is where everything of a segment is, read once from its header at attach
// and checked word by word (docs/segment-format.md, section 4); never re-read.
type Geometry struct {
	Size     int64 // bytes of the file
	KeySize  int64
	MaxValue int64
	Slots    int64 // index slots per bucket
	Ring     int64 // ring bytes per bucket
}

func (g Geometry) indexOff() int64 { return fixedBytes }
func (g Geometry) ringOff() int64  { return align(fixedBytes+NBuckets*g.Slots*word, page) }

// MaxLive is the most live entries a bucket holds.
func (g Geometry) MaxLive() int64 { return g.Slots * maxLoadNum / maxLoadDen }

// segment is one mapping of a cache's file, with views of its sections.
type segment struct {
	data       []byte
	geo        Geometry
	header     []int64
	writers    []int64
	workers    []int64
	partitions []int64
	meta       *[NBuckets * rowWords]int64 // an array: a bucket's words need no bounds check
	index      []int64
	ring       []byte
	tab        table // the lookups' view of meta, index and ring (lookup.go)
	ident      identity
	creationID int64
	fd         int         // the file, open while mapped
	owners     judge       // who of its owner words lives (section 13)
	lost       atomic.Bool // the file was cut short under the mapping (a fault was caught)
}

// checkHeader is the attach checks of section 4 on the first header words h of a file of
// fileSize bytes: the geometry, or an error naming the first field that is wrong.
func checkHeader(cache, path string, fileSize int64, h func(int) int64, magic int64) (Geometry, error) {
	if magic == 0 {
		return Geometry{}, newErr(cache, ErrNotACache, "%s has no shmcache magic (shmcache did not make it, or its "+
			"header was overwritten): not a usable cache", path)
	}
	if magic != Magic {
		return Geometry{}, newErr(cache, ErrNotACache, "%s is not a shmcache segment (bad magic)", path)
	}
	if v := h(hVersion); v != LayoutVersion {
		return Geometry{}, newErr(cache, ErrVersion, "has layout version %d; this reader reads version %d", v, LayoutVersion)
	}
	bad := func(field string, w int, should string, args ...any) error {
		return newErr(cache, ErrCorrupt, "header field %s is %d; it should be %s (a damaged or foreign segment)",
			field, h(w), fmt.Sprintf(should, args...))
	}
	ks, maxv, slots, ring, size := h(hKeySize), h(hMaxValue), h(hSlots), h(hRing), h(hSize)
	switch {
	case h(hNBuckets) != NBuckets:
		return Geometry{}, bad("nbuckets", hNBuckets, "%d", NBuckets)
	case ks < 1 || ks > maxKeySize:
		return Geometry{}, bad("key_size", hKeySize, "from 1 to %d", maxKeySize)
	case maxv < 0 || maxv > 0xFFFFFFFF:
		return Geometry{}, bad("max_value", hMaxValue, "from 0 to 2**32-1")
	case slots < minSlots || slots&(slots-1) != 0 || slots > posMask:
		return Geometry{}, bad("slots", hSlots, "a power of two from %d to 2**%d", minSlots, posBits-1)
	case ring <= 0 || ring%recordAlign != 0 || ring > posMask:
		return Geometry{}, bad("ring", hRing, "a positive multiple of %d below 2**%d", recordAlign, posBits)
	case ring < recordSize(ks, maxv):
		return Geometry{}, bad("ring", hRing, ">= %d, one record of key_size=%d and max_value=%d", recordSize(ks, maxv), ks, maxv)
	}
	// slots <= 2^46 and ring < 2^47: the size derived from them is under 2^63 (section 4)
	derived := align(fixedBytes+NBuckets*slots*word, page) + NBuckets*ring
	switch {
	case size != derived:
		return Geometry{}, bad("size", hSize, "%d, as derived from slots=%d and ring=%d", derived, slots, ring)
	case size != fileSize:
		return Geometry{}, bad("size", hSize, "%d, the size of the file", fileSize)
	case h(hTopicLen) < 0 || h(hTopicLen) > topicMax:
		return Geometry{}, bad("topic_len", hTopicLen, "from 0 to %d", topicMax)
	case h(hPartitions) < 0 || h(hPartitions) > maxPartitions:
		return Geometry{}, bad("partitions", hPartitions, "from 0 to %d", maxPartitions)
	}
	return Geometry{Size: size, KeySize: ks, MaxValue: maxv, Slots: slots, Ring: ring}, nil
}

// openSegment opens, checks and maps the file at path (sections 1 and 4): its owner (when
// owner >= 0) and its mode on fstat of the open file before any byte of it is read, then
// its header; the page tables are filled at once only for a file wholly allocated.
func openSegment(cache, path string, owner int64) (*segment, error) {
	fd, f, err := openRegular(cache, path, false)
	if err != nil {
		return nil, err
	}
	kept := false // the segment keeps its file open: its owners' locks are tested on it (section 13)
	defer func() {
		if !kept {
			closeFD(fd)
		}
	}()
	if err := checkOwner(cache, path, f, owner); err != nil {
		return nil, err
	}
	if err := checkMode(cache, path, f); err != nil {
		return nil, err
	}
	size := f.size
	head := pread(fd, page)
	if size < page || len(head) < page {
		return nil, newErr(cache, ErrNotACache, "%s is %d bytes, not a shmcache segment", path, size)
	}
	hw := func(i int) int64 { return int64(binary.LittleEndian.Uint64(head[i*word:])) }
	if _, err := checkHeader(cache, path, size, hw, hw(hMagic)); err != nil {
		return nil, err // refused having read one page, before anything is mapped
	}
	data, err := mapFile(fd, size, false, f.whole())
	if err != nil {
		return nil, newErr(cache, ErrNotACache, "cannot map %s (%d bytes): %v", path, size, err)
	}
	s := &segment{data: data, ident: f.ident, fd: fd}
	s.header = words(data, 0, page/word)
	var geo Geometry
	err = protect(func() error { // checked again on the mapping: the file may have changed since
		g, err := checkHeader(cache, path, size, func(i int) int64 { return s.header[i] }, atomic.LoadInt64(&s.header[hMagic]))
		geo = g
		return err
	})
	if err != nil {
		unmap(data)
		return nil, err
	}
	s.geo = geo
	s.writers = words(data, writersOff, maxWriters*rowWords)
	s.workers = words(data, workersOff, maxWorkers*rowWords)
	s.partitions = words(data, partitionsOff, maxPartitions*rowWords)
	s.meta = (*[NBuckets * rowWords]int64)(words(data, metaOff, NBuckets*rowWords))
	s.index = words(data, geo.indexOff(), NBuckets*geo.Slots)
	s.ring = data[geo.ringOff():geo.Size]
	s.tab = newTable(s)
	s.creationID = s.header[hCreationID]
	s.owners = judge{fd: fd, locks: s.header[hOwnerLocks] == 1}
	kept = true
	return s, nil
}

func (s *segment) close() {
	if s != nil {
		unmap(s.data)
		s.data = nil
		closeFD(s.fd)
		s.fd = -1
	}
}

// writerAlive says whether the writer whose owner word w a bucket's lock holds runs: with
// owner locks, a writer row holding w is alive (a writer takes its row before any lock).
func (s *segment) writerAlive(w int64) bool {
	if w == 0 {
		return false
	}
	if !s.owners.locks || w == myOwnerWord() {
		return s.owners.alive(w, 0)
	}
	for r := int64(0); r < maxWriters; r++ {
		if atomic.LoadInt64(&s.writers[r*rowWords+wOwner]) == w && s.owners.alive(w, writersOff/word+r*rowWords+wOwner) {
			return true
		}
	}
	return false
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$`)

// Cache is a read-only handle on one cache: Attach(name) or AttachPath(path). It is safe
// for concurrent use by many goroutines. Close unmaps it; it never destroys the cache.
type Cache struct {
	name   string
	path   string
	follow bool  // attached by name: what is at the name is followed (section 1)
	owner  int64 // the uid the file must belong to (WithOwner), -1 any

	mu        sync.RWMutex // held for reading by every call, for writing to swap or drop the mapping
	seg       *segment     // nil: nothing usable at the name (err says why)
	err       error        // why seg is nil
	comp      *companion
	closed    bool
	nextCheck atomic.Int64 // monotonic ns of the next look at the name (0: at the next call)

	hits, misses, retries, corruptions atomic.Int64 // this handle's own
	valueGuess                         atomic.Int64 // mean value length of the last batch with hits
	Logf                               func(format string, args ...any)
	warned                             sync.Map // buckets this handle has logged
}

// Attach maps cache name (/dev/shm/NAME) read-only, after every check of the
// specification, and joins its readers' companion to count hits and misses. The handle
// follows the name ([format section 1]): it looks at the name at least
// every 0.1 s while it is used, and once the name holds another file or nothing, it drops
// its mapping at once; its calls then fail with ErrNotFound (nothing there) or with the
// error of what is there (not a cache, another user's, ...) for as long as it is there,
// looking again at every call, and a new cache there is mapped and served. So a destroyed
// cache answers for at most 0.1 s more, and a cache created again is read within 0.1 s.
//
// Options: WithOwner. An invalid name (1-200 of A-Z, a-z, 0-9, '.', '_' and '-', starting
// with a letter or digit) is ErrBadArgument.
//
// [format section 1]: https://github.com/shmcache/shmcache/blob/main/docs/segment-format.md#1-files-and-names
func Attach(name string, opts ...Option) (*Cache, error) {
	if !nameRE.MatchString(name) {
		return nil, newErr(name, ErrBadArgument, "not a valid cache name: use 1-200 letters, digits, '.', '_' or "+
			"'-', starting with a letter or digit")
	}
	return attach(name, shmDir+"/"+name, true, opts)
}

// AttachPath maps a segment's file anywhere (a golden segment, a copy): the same checks,
// no companion (lookups are counted by this handle only), no following of a name.
func AttachPath(path string, opts ...Option) (*Cache, error) { return attach(path, path, false, opts) }

func attach(name, path string, follow bool, opts []Option) (*Cache, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	owner, err := o.ownerUID(name)
	if err != nil {
		return nil, err
	}
	s, err := openSegment(name, path, owner)
	if err != nil {
		return nil, err
	}
	c := &Cache{name: name, path: path, follow: follow, owner: owner, seg: s}
	c.valueGuess.Store(aheadValue)
	if follow {
		c.comp = openCompanion(name, s.creationID, owner)
		c.nextCheck.Store(monotonicNS() + followIntervalNS)
	}
	return c, nil
}

// Name is the cache's name (its path, for AttachPath).
func (c *Cache) Name() string { return c.name }

// Close unmaps the cache (and its companion). Never destroys; safe to call twice.
func (c *Cache) Close() error {
	if c == nil { // what a failed Attach returned: nothing to close
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.seg.close()
	c.seg = nil
	c.comp.close()
	c.comp = nil
	return nil
}

// acquire read-locks the handle and returns its mapping; release with c.mu.RUnlock().
// A handle attached by name looks at the name first: every followIntervalNS while it
// maps a cache, at every call while it maps nothing.
func (c *Cache) acquire() (*segment, error) {
	if c.follow {
		now := monotonicNS()
		if next := c.nextCheck.Load(); now >= next && c.nextCheck.CompareAndSwap(next, now+followIntervalNS) {
			c.refresh()
		}
	}
	c.mu.RLock()
	switch {
	case c.closed:
		c.mu.RUnlock()
		return nil, newErr(c.name, ErrClosed, "this handle is closed")
	case c.seg == nil:
		err := c.err
		c.mu.RUnlock()
		return nil, err
	case c.seg.lost.Load():
		c.mu.RUnlock()
		return nil, lostErr(c.name, c.path)
	}
	return c.seg, nil
}

// refresh looks at the name (section 1, "Following a name"). While it holds the file
// mapped, nothing changes. Otherwise the mapping is dropped and what is there now is
// opened with every check: a cache is mapped; nothing, or a file that fails a check,
// leaves the handle without a mapping, its calls failing with that error, and the next
// call looks again.
func (c *Cache) refresh() {
	now, there := identityAt(c.path)
	c.mu.RLock()
	keep := c.closed || (c.seg != nil && there && c.seg.ident == now)
	c.mu.RUnlock()
	if keep {
		return
	}
	var s *segment
	var comp *companion
	err := newErr(c.name, ErrNotFound, "was destroyed (nothing at %s); it is mapped again once it is re-created",
		c.path)
	if there {
		if s, err = openSegment(c.name, c.path, c.owner); err == nil {
			comp = openCompanion(c.name, s.creationID, c.owner)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		s.close()
		comp.close()
		return
	}
	c.seg.close()
	c.comp.close()
	c.seg, c.comp, c.err = s, comp, err
	if s == nil {
		c.nextCheck.Store(0) // nothing usable: the next call looks again
	}
}

// CreationID is the random id of the cache's creation as mapped now.
func (c *Cache) CreationID() (int64, error) {
	s, err := c.acquire()
	if err != nil {
		return 0, err
	}
	defer c.mu.RUnlock()
	return s.creationID, nil
}

// Geometry of the cache as mapped now.
func (c *Cache) Geometry() (Geometry, error) {
	s, err := c.acquire()
	if err != nil {
		return Geometry{}, err
	}
	defer c.mu.RUnlock()
	return s.geo, nil
}

func lostErr(cache, path string) error {
	return newErr(cache, ErrCorrupt, "%s was cut short while this process mapped it (truncated by a process that "+
		"may write it); its content is gone from this handle: attach again, or destroy and re-create the cache", path)
}

func closeFD(fd int) { _ = closeFile(fd) }
