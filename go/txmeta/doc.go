// Package txmeta reads Teranode's transaction metadata from a shmcache cache: the decoder
// of the txmeta value (Meta, Decode) and a cache shaped like Teranode's txmetacache as
// subtree validation calls it at the Teranode commit docs/teranode.md names (Cache:
// GetMetaCached, GetMetaCachedBatch, Health, GetCacheStats).
//
// The cache is filled by the shmcache supervisor (`shmcache run`) from the txmeta Kafka
// topic; this package only reads. Every Go service of the machine attaches the same copy,
// which outlives their restarts.
//
//	c, err := txmeta.Attach("txmeta")
//	if err != nil { return err }                          // shmcache.Kind(err) says why
//	defer c.Close()
//	err = c.WaitReady(ctx)                                // the whole topic applied
//	var b txmeta.Batch                                    // reused: no allocation per batch
//	err = txmeta.GetMetaCachedBatch(ctx, c, hashes, &b)   // hashes: []chainhash.Hash or [][32]byte
//	for i := range b.Len() { if b.Outcomes[i] == txmeta.Hit { m := &b.Metas[i] } }
//
// Not guaranteed (as for every shmcache reader): an entry may be evicted at any time, so
// a miss falls through to the store of record; a key written while it is read reads as
// the old or the new value; stats are a snapshot. The mapping of each txmetacache method
// subtree validation calls to this package, with a worked adapter, is [Teranode's txmeta
// cache]; the reader underneath is [the Go guide]'s.
//
// [Teranode's txmeta cache]: https://github.com/shmcache/shmcache/blob/main/docs/teranode.md
// [the Go guide]: https://github.com/shmcache/shmcache/blob/main/docs/go.md
package txmeta
