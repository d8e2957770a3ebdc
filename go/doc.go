// Package shmcache reads shmcache caches: hash tables in POSIX shared memory
// (/dev/shm/NAME) that a shmcache supervisor keeps filled from a Kafka topic, read by
// every process of the machine at memory speed. It is a pure-Go reader (CGO_ENABLED=0
// builds it) of the [segment format], layout version 1.
//
//	c, err := shmcache.Attach("txmeta", shmcache.WithOwner("shmcache")) // read-only; errors.Is(err, shmcache.ErrNotFound)
//	if err != nil { return err }
//	defer c.Close()
//	_, err = c.WaitReady(ctx)           // the whole topic applied, or an error saying why not
//	var b shmcache.Batch                // reuse: no allocation per key
//	err = c.GetMany(keys, &b)           // keys: n * 32 bytes back to back
//	for i := range b.Len() { v := b.Value(i) /* nil: a miss */ }
//
// It keeps the promises of [the readers' contract] (its Go page, [the Go guide], says
// them in full). A reader takes no lock and never blocks a writer; a bucket a writer is
// changing is read again. A damaged bucket or record is a miss and a counted corruption;
// a lookup call waits at most 1 s in all on buckets kept mid-write by a stopped process
// (their keys are misses); a file cut short under the mapping is an error (ErrCorrupt),
// never a SIGBUS. With WithOwner, another user's file is refused (ErrWrongOwner); a file
// its group or others may write always is (ErrUnsafeMode). A handle attached by name
// follows it: a destroyed cache answers for at most 0.1 s more, what is at the name now
// answers, and a cache created again there is mapped within 0.1 s. Hits and misses count
// in the cache's readers' companion, as the Python reader's do, so `shmcache stats` and
// `shmcache top` see Go readers. Kind(err) is an error's word in the contract.
//
// Not guaranteed: an entry may be evicted at any time once its bucket is full; a key
// set while it is read reads as the old or the new value; stats are a snapshot.
// Linux only. Tested on amd64 (the engine's platform); elsewhere (arm64) it builds, reads
// with a load fence in the seqlock (fence_other.go) and touches lines instead of
// prefetching (prefetch_other.go), untested on such hardware here.
//
// The module is github.com/shmcache/shmcache/go, the go/ folder of the repository; its
// releases are tagged go/vX.Y.Z (go get github.com/shmcache/shmcache/go@v0.1.0 takes the
// tag go/v0.1.0). It requires xxhash and x/sys only. Package txmeta, beside it, decodes
// Teranode's txmeta values and gives a cache shaped like Teranode's txmetacache over this
// reader ([the Teranode page] maps each method). Links in this documentation are to the
// repository's docs/ folder on GitHub, on its main branch.
//
// [segment format]: https://github.com/shmcache/shmcache/blob/main/docs/segment-format.md
// [the readers' contract]: https://github.com/shmcache/shmcache/blob/main/docs/reader-contract.md
// [the Go guide]: https://github.com/shmcache/shmcache/blob/main/docs/go.md
// [the Teranode page]: https://github.com/shmcache/shmcache/blob/main/docs/teranode.md
package shmcache
