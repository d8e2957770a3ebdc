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
	meta       []int64
	index      []int64
	ring       []byte
	ident      identity
	creationID int64
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
	// slots and ring are bounded above by the file's size before they are multiplied
	if slots > fileSize || ring > fileSize {
		return Geometry{}, bad("size", hSize, "%d, the size of the file", fileSize)
	}
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

// openSegment opens, checks and maps the file at path (section 1 and 4).
func openSegment(cache, path string) (*segment, error) {
	fd, size, err := openRegular(cache, path, false)
	if err != nil {
		return nil, err
	}
	defer closeFD(fd)
	head := pread(fd, page)
	if size < page || len(head) < page {
		return nil, newErr(cache, ErrNotACache, "%s is %d bytes, not a shmcache segment", path, size)
	}
	hw := func(i int) int64 { return int64(binary.LittleEndian.Uint64(head[i*word:])) }
	if _, err := checkHeader(cache, path, size, hw, hw(hMagic)); err != nil {
		return nil, err // refused having read one page, before anything is mapped
	}
	data, err := mapFile(fd, size, false)
	if err != nil {
		return nil, newErr(cache, ErrNotACache, "cannot map %s (%d bytes): %v", path, size, err)
	}
	s := &segment{data: data, ident: identityOf(fd)}
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
	s.meta = words(data, metaOff, NBuckets*rowWords)
	s.index = words(data, geo.indexOff(), NBuckets*geo.Slots)
	s.ring = data[geo.ringOff():geo.Size]
	s.creationID = s.header[hCreationID]
	return s, nil
}

func (s *segment) close() {
	if s != nil {
		unmap(s.data)
		s.data = nil
	}
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$`)

// Cache is a read-only handle on one cache: Attach(name) or AttachPath(path). It is safe
// for concurrent use by many goroutines. Close unmaps it; it never destroys the cache.
type Cache struct {
	name   string
	path   string
	follow bool // attached by name: a re-created cache at the name is mapped again

	mu        sync.RWMutex // held for reading by every call, for writing to swap or drop the mapping
	seg       *segment
	comp      *companion
	closed    bool
	nextCheck atomic.Int64 // monotonic ns of the next look at the name

	hits, misses, retries, corruptions atomic.Int64 // this handle's own
	valueGuess                         atomic.Int64 // mean value length of the last batch with hits
	Logf                               func(format string, args ...any)
	warned                             sync.Map // buckets this handle has logged
}

// Attach maps cache name (/dev/shm/NAME) read-only, after every check of the
// specification, and joins its readers' companion to count hits and misses. A cache
// destroyed and created again under the name is noticed (within 0.1 s) and mapped again.
func Attach(name string) (*Cache, error) {
	if !nameRE.MatchString(name) {
		return nil, newErr(name, ErrNotFound, "not a valid cache name: use 1-200 letters, digits, '.', '_' or '-', "+
			"starting with a letter or digit")
	}
	return attach(name, shmDir+"/"+name, true)
}

// AttachPath maps a segment's file anywhere (a golden segment, a copy): the same checks,
// no companion (lookups are counted by this handle only), no following of a name.
func AttachPath(path string) (*Cache, error) { return attach(path, path, false) }

func attach(name, path string, follow bool) (*Cache, error) {
	s, err := openSegment(name, path)
	if err != nil {
		return nil, err
	}
	c := &Cache{name: name, path: path, follow: follow, seg: s}
	c.valueGuess.Store(aheadValue)
	if follow {
		c.comp = openCompanion(name, s.creationID)
		c.nextCheck.Store(monotonicNS() + followIntervalNS)
	}
	return c, nil
}

// Name is the cache's name (its path, for AttachPath).
func (c *Cache) Name() string { return c.name }

// Close unmaps the cache (and its companion). Never destroys; safe to call twice.
func (c *Cache) Close() error {
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
// A handle attached by name looks at the name every followIntervalNS first.
func (c *Cache) acquire() (*segment, error) {
	if c.follow {
		if now := monotonicNS(); now >= c.nextCheck.Load() {
			c.nextCheck.Store(now + followIntervalNS)
			c.refresh()
		}
	}
	c.mu.RLock()
	switch {
	case c.closed:
		c.mu.RUnlock()
		return nil, newErr(c.name, ErrClosed, "this handle is closed")
	case c.seg == nil:
		c.mu.RUnlock()
		return nil, newErr(c.name, ErrNotFound, "was destroyed (no %s); it is mapped again once it is re-created", c.path)
	case c.seg.lost.Load():
		c.mu.RUnlock()
		return nil, lostErr(c.name, c.path)
	}
	return c.seg, nil
}

// refresh maps what is at the name now if it is another file than the one mapped.
func (c *Cache) refresh() {
	now, there := identityAt(c.path)
	c.mu.RLock()
	same := c.closed || (c.seg != nil && there && c.seg.ident == now) || (c.seg == nil && !there)
	c.mu.RUnlock()
	if same {
		return
	}
	var s *segment
	if there {
		var err error
		if s, err = openSegment(c.name, c.path); err != nil {
			return // a damaged or half-gone file: keep what is mapped, look again later
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		s.close()
		return
	}
	c.seg.close()
	c.comp.close()
	c.seg, c.comp = s, nil
	if s != nil {
		c.comp = openCompanion(c.name, s.creationID)
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
