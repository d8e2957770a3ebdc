package shmcache_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	shmcache "github.com/shmcache/shmcache/go"
)

// The README's example: attach a cache by name, wait until it holds the whole topic,
// look a batch of keys up into a reused Batch. Compiled by go vet and go test, so the
// README's lines cannot drift from the API.
func Example() {
	c, err := shmcache.Attach("txmeta")
	if errors.Is(err, shmcache.ErrNotFound) {
		return // no cache of that name on this machine
	} else if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.WaitReady(ctx); err != nil {
		panic(err) // not ready in 10 s: the error says why
	}
	keys := make([]byte, 2*32) // two 32-byte keys, back to back
	var b shmcache.Batch       // reused across calls: no allocation per key
	if err := c.GetMany(keys, &b); err != nil {
		panic(err)
	}
	for i := range b.Len() {
		fmt.Println(b.Has(i), b.Value(i)) // a miss: false, nil
	}
}
