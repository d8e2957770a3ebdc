package txmeta_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	shmcache "github.com/shmcache/shmcache/go"
	"github.com/shmcache/shmcache/go/txmeta"
)

// cacheName is the cache the examples read: "txmeta" on a Teranode host. `go test` points
// it at a copy of golden/base.shm.gz (example_main_test.go), a cache no supervisor fills.
var cacheName = "txmeta"

// Attach the machine's txmeta cache, refusing one the shmcache user does not own, and wait
// until it holds the whole topic.
func ExampleAttach() {
	c, err := txmeta.Attach("txmeta", shmcache.WithOwner("shmcache"))
	if errors.Is(err, shmcache.ErrNotFound) {
		return // no cache of that name on this machine: `shmcache run --name txmeta ...` makes it
	} else if err != nil {
		log.Fatal(err) // one line naming the cache and what was wrong
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		log.Fatal(err) // not ready in 30 s: the error says why (no supervisor, lagging partitions, ...)
	}
}

// A service's start and its lookups, as subtree validation's processTxMetaUsingCache
// makes them: attach, wait until the cache holds the whole topic, then a batch of tx
// hashes a call into a Batch reused from call to call. hashes may be a []chainhash.Hash as
// it is.
func ExampleGetMetaCachedBatch() {
	c, err := txmeta.Attach("txmeta")
	if errors.Is(err, shmcache.ErrNotFound) {
		return // no cache of that name on this machine
	} else if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		log.Fatal(err) // not ready in 30 s: the error says why
	}
	hashes := make([][32]byte, txmeta.BatchSize) // the subtree's tx hashes
	var b txmeta.Batch                           // one a goroutine, reused: no allocation a batch
	if err := txmeta.GetMetaCachedBatch(ctx, c, hashes, &b); err != nil {
		log.Fatal(err) // for the whole call: the cache destroyed, the handle closed, ctx done
	}
	for i := range b.Len() {
		if m := b.Meta(i); m != nil {
			_ = m.Fee // a hit: m.Parents, m.ParentVouts, ... (b's until the next call)
		} // else b.Outcomes[i] is Miss or Malformed: ask the store of record
	}
	fmt.Println(b.Hits, b.Misses, b.Malformed)
}

// Decode a txmeta value (here: fee 1234, size 225, one parent spending vout 1, block
// height 850123) into a Meta that is reused, so nothing is allocated once it has grown.
func ExampleMeta_Decode() {
	v, _ := hex.DecodeString("d204000000000000e1000000000000000001000000" +
		"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f" +
		"0100000001000000" + "000cf8cb")
	var m txmeta.Meta
	if err := m.Decode(v); err != nil {
		log.Fatal(err) // errors.Is(err, txmeta.ErrMalformed)
	}
	fmt.Println(m.Fee, m.Size, m.IsCoinbase(), len(m.Parents), m.ParentVouts, m.BlockHeight, m.HasHeight)
	fmt.Println(m.Decode(v[:len(v)-1]))
	// Output:
	// 1234 225 false 1 [[1]] 850123 true
	// txmeta: a value of 64 bytes is malformed: the bytes after the last vout list are neither none nor a 4-byte height
}

// Answer a load balancer's probes: liveness while the cache is readable, readiness once
// it is ready, with the reason when it is not (here: a cache no supervisor fills).
func ExampleCache_Health() {
	c, err := txmeta.Attach(cacheName)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for _, liveness := range []bool{true, false} {
		code, msg, _ := c.Health(context.Background(), liveness)
		fmt.Println(code, strings.TrimPrefix(msg, "txmeta cache '"+c.Name()+"': "))
	}
	// Output:
	// 200 attached
	// 503 not ready (no-supervisor): no live supervisor
}
