package shmcache

// The readers' companion (docs/segment-format.md, section 13): a reader counts its hits
// and misses in its handle's row of /dev/shm/.shmcache-NAME.readers, so that stats,
// `shmcache top` and the metrics see Go readers as they see Python ones. A reader that
// cannot use the companion counts only in its handle; lookups never fail for it.

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
)

type companion struct {
	data     []byte
	rows     []int64
	writable bool
	owners   judge // the file, open while mapped, and whether its rows' owners hold owner locks
	once     sync.Once
	row      []int64 // this handle's row, claimed at the first batch; nil: uncounted
	lost     atomic.Bool
	counting atomic.Bool // a row is claimed: this process's lookups are counted there
}

func companionPath(name string) string { return shmDir + "/.shmcache-" + name + ".readers" }

// openCompanion maps the companion of the cache with this creation id; nil if there is
// none usable (no file, not ours to open, another user's when an owner is named (owner
// >= 0), not its size, another cache's). Its mode is not checked: the readers' group
// writes it by design.
func openCompanion(name string, creationID int64, owner int64) *companion {
	path := companionPath(name)
	write := true
	fd, f, err := openRegular(name, path, true)
	if err != nil {
		write = false // a reader allowed to read the sums, not to count
		if fd, f, err = openRegular(name, path, false); err != nil {
			return nil
		}
	}
	if f.size != companionSize || checkOwner(name, path, f, owner) != nil {
		closeFD(fd)
		return nil
	}
	data, err := mapFile(fd, f.size, write, f.whole())
	if err != nil {
		closeFD(fd)
		return nil
	}
	c := &companion{data: data, writable: write}
	h := words(data, 0, 3)
	var ours bool
	var version int64
	if protect(func() error {
		version = h[1]
		ours = h[0] == companionMagic && version >= 1 && version <= companionVersion && h[companionCreation] == creationID
		return nil
	}) != nil || !ours {
		unmap(data)
		closeFD(fd)
		return nil
	}
	c.owners = judge{fd: fd, locks: version >= companionLocks}
	c.rows = words(data, page, maxReaders*rowWords)
	return c
}

func (c *companion) close() {
	if c != nil {
		if c.row != nil && c.owners.locks && !c.lost.Load() {
			_ = protect(func() error { // the row is free again; its counters stay
				atomic.CompareAndSwapInt64(&c.row[rOwner], myOwnerWord(), 0)
				return nil
			})
		}
		unmap(c.data)
		closeFD(c.owners.fd) // and with it the row's owner lock
		c.data, c.rows, c.row = nil, nil, nil
	}
}

// rowWord is the file word index of row r's owner word.
func rowWord(r int) int64 { return page/word + int64(r)*rowWords + rOwner }

// claim finds this handle's row. With owner locks: the first row, free first, whose owner
// lock it can take. Without: one holding the process's owner word already, else a free
// one, else one whose owner died (compare-and-swap each time).
func (c *companion) claim() {
	me := myOwnerWord()
	if !c.writable || me == 0 {
		return
	}
	if c.owners.locks {
		for _, free := range []bool{true, false} {
			for r := 0; r < maxReaders; r++ {
				p := &c.rows[r*rowWords+rOwner]
				cur := atomic.LoadInt64(p)
				if (cur == 0) != free || !lockOwner(c.owners.fd, rowWord(r)) {
					continue
				}
				if atomic.CompareAndSwapInt64(p, cur, me) {
					c.row = c.rows[r*rowWords : (r+1)*rowWords]
					c.counting.Store(true)
					return
				}
				unlockOwner(c.owners.fd, rowWord(r))
			}
		}
		return
	}
	for r := 0; r < maxReaders; r++ {
		if atomic.LoadInt64(&c.rows[r*rowWords]) == me {
			c.row = c.rows[r*rowWords : (r+1)*rowWords]
			c.counting.Store(true)
			return
		}
	}
	for _, free := range []bool{true, false} {
		for r := 0; r < maxReaders; r++ {
			p := &c.rows[r*rowWords+rOwner]
			cur := atomic.LoadInt64(p)
			if (cur == 0) == free && (free || !IsAlive(cur)) && atomic.CompareAndSwapInt64(p, cur, me) {
				c.row = c.rows[r*rowWords : (r+1)*rowWords]
				c.counting.Store(true)
				return
			}
		}
	}
}

// add counts one lookup call. A fault (the companion cut short by another reader of the
// group) turns the counters off for this handle; the cache is not touched.
func (c *companion) add(hits, misses, retries, corruptions int64) {
	if c == nil || c.lost.Load() {
		return
	}
	defer func() {
		debug.SetPanicOnFault(false)
		if r := recover(); r != nil {
			if _, ok := r.(addrError); !ok {
				panic(r)
			}
			c.lost.Store(true)
		}
	}()
	debug.SetPanicOnFault(true)
	c.once.Do(c.claim)
	if row := c.row; row != nil {
		atomic.AddInt64(&row[rHits], hits)
		atomic.AddInt64(&row[rMisses], misses)
		atomic.AddInt64(&row[rBatches], 1)
		if retries != 0 {
			atomic.AddInt64(&row[rRetries], retries)
		}
		if corruptions != 0 {
			atomic.AddInt64(&row[rCorruptions], corruptions)
		}
	}
}

// totals sums every row; ok false when there is no usable companion.
func (c *companion) totals() (t readerTotals, ok bool) {
	if c == nil || c.lost.Load() {
		return t, false
	}
	err := protect(func() error {
		for r := 0; r < maxReaders; r++ {
			row := c.rows[r*rowWords : (r+1)*rowWords]
			t.hits += atomic.LoadInt64(&row[rHits])
			t.misses += atomic.LoadInt64(&row[rMisses])
			t.batches += atomic.LoadInt64(&row[rBatches])
			t.corruptions += atomic.LoadInt64(&row[rCorruptions])
			if c.owners.alive(atomic.LoadInt64(&row[rOwner]), rowWord(r)) {
				t.readers++
			}
		}
		return nil
	})
	if err != nil {
		c.lost.Store(true)
		return readerTotals{}, false
	}
	return t, true
}

type readerTotals struct{ hits, misses, batches, corruptions, readers int64 }
