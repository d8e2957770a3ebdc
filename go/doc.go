// Package shmcache reads shmcache caches: hash tables in POSIX shared memory
// (/dev/shm/NAME) that a shmcache supervisor keeps filled from a Kafka topic, read by
// every process of the machine at memory speed. It is a pure-Go reader of the segment
// format of ../docs/segment-format.md (layout version 1; CGO_ENABLED=0 builds it).
//
//	c, err := shmcache.Attach("txmeta", shmcache.WithOwner("shmcache")) // read-only; errors.Is(err, shmcache.ErrNotFound)
//	defer c.Close()
//	var b shmcache.Batch                // reuse: no allocation per key
//	err = c.GetMany(keys, &b)           // keys: n * 32 bytes back to back
//	for i := 0; i < b.Len(); i++ { v := b.Value(i) /* nil: a miss */ }
//
// It keeps the promises of the readers' contract (../docs/reader-contract.md, and
// ../docs/go.md, "Guarantees"). A reader takes no lock and never blocks a writer; a
// bucket a writer is changing is read again. A damaged bucket or record is a miss and a
// counted corruption; a lookup call waits at most 1 s in all on buckets kept mid-write by
// a stopped process (their keys are misses); a file cut short under the mapping is an
// error (ErrCorrupt), never a SIGBUS. With WithOwner, another user's file is refused
// (ErrWrongOwner); a file its group or others may write always is (ErrUnsafeMode). A
// handle attached by name follows it: a destroyed cache answers for at most 0.1 s more,
// what is at the name now answers, and a cache created again there is mapped within
// 0.1 s. Hits and misses count in the cache's readers' companion, as the Python reader's
// do, so `shmcache stats` and `shmcache top` see Go readers. Kind(err) is an error's word
// in the contract.
//
// Not guaranteed: an entry may be evicted at any time once its bucket is full; a key
// set while it is read reads as the old or the new value; stats are a snapshot.
// Linux only. Tested on amd64 (the engine's platform); elsewhere (arm64) it builds, reads
// with a load fence in the seqlock (fence_other.go) and touches lines instead of
// prefetching (ahead.go), untested on such hardware here.
package shmcache
