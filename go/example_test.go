package shmcache_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net/http"
	"time"

	shmcache "github.com/shmcache/shmcache/go"
)

// cacheName is the cache the examples read: "txmeta" on a Teranode host. `go test` points
// it at a copy of golden/base.shm.gz (example_main_test.go): a cache of a few entries that
// no supervisor fills, so the examples' output is the same on every machine.
var cacheName = "txmeta"

// The README's example, a service's whole start: attach a cache by name, refusing one the
// shmcache user does not own, wait until it holds the whole topic, then look batches up
// into one reused Batch. Compiled by go vet and go test (not run: it needs the machine's
// cache), so the README's lines cannot drift from the API.
func Example() {
	c, err := shmcache.Attach("txmeta", shmcache.WithOwner("shmcache"))
	if errors.Is(err, shmcache.ErrNotFound) {
		return // no cache of that name on this machine
	} else if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.WaitReady(ctx); err != nil {
		log.Fatal(err) // not ready in 10 s: the error says why
	}
	keys := make([]byte, 2*32) // two 32-byte keys, back to back
	var b shmcache.Batch       // reused across calls: no allocation per key
	if err := c.GetMany(keys, &b); err != nil {
		log.Fatal(err)
	}
	for i := range b.Len() {
		fmt.Println(b.Has(i), b.Value(i)) // a miss: false, nil
	}
}

// Attach fails with an error that names the cache and the cause, one line; errors.Is
// tells the cases apart (ErrNotFound is also fs.ErrNotExist), and Kind gives the word every
// reader prints for it.
func ExampleAttach() {
	for _, name := range []string{"no-such-cache-here", "../etc/passwd"} {
		_, err := shmcache.Attach(name)
		fmt.Println(shmcache.Kind(err), errors.Is(err, fs.ErrNotExist), errors.Is(err, shmcache.ErrBadArgument))
	}
	c, err := shmcache.Attach(cacheName)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	g, _ := c.Geometry()
	fmt.Println("key size", g.KeySize)
	// Output:
	// not-found true false
	// bad-argument false true
	// key size 32
}

// WaitReady returns once the cache holds the whole topic. This one has no supervisor, so
// it is not ready by the deadline: the error is ErrNotReady (and the context's error), and
// the Status says why in the contract's words.
func ExampleCache_WaitReady() {
	c, err := shmcache.Attach(cacheName)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	st, err := c.WaitReady(ctx)
	fmt.Println(errors.Is(err, shmcache.ErrNotReady), errors.Is(err, context.DeadlineExceeded))
	fmt.Println(st.Ready, st.Reason, st.Why)
	// Output:
	// true true
	// false no-supervisor no live supervisor
}

// A batch of keys in one call, into a Batch reused from call to call: nothing is
// allocated per key once it has grown. A value is a view of the Batch, valid until its
// next call; an empty value found is an empty slice, a miss nil.
func ExampleCache_GetMany() {
	c, err := shmcache.Attach(cacheName)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	var keys []byte // 32-byte keys, back to back
	for _, h := range []string{
		"fdec4931e276d4a02b892c1744c268294ff747b895e719b0fd5cb6f309667a6b", // a value of 15 bytes
		"4bbc5b67bdd316e556339b65de6e1fb8d24834ed0dfeea5142dc8977180531d7", // an empty value
		"b7f192ed27914dc2ac5adf263527dd07fc6b70c522464c86489b2dc443cde987", // never set
	} {
		k, _ := hex.DecodeString(h)
		keys = append(keys, k...)
	}
	var b shmcache.Batch
	if err := c.GetMany(keys, &b); err != nil {
		log.Fatal(err) // for the whole call: the handle closed, the cache destroyed or cut short
	}
	for i := range b.Len() {
		fmt.Printf("%d: found %v, value [%x], nil %v\n", i, b.Has(i), b.Value(i), b.Value(i) == nil)
	}
	fmt.Println(b.Hits(), "of", b.Len())
	// Output:
	// 0: found true, value [cfcbb9ace6d91f71ad31eba70ab3d4], nil false
	// 1: found true, value [], nil false
	// 2: found false, value [], nil true
	// 2 of 3
}

// Health for a load balancer: Status reads readiness from the cache's control area alone,
// with the reason word and sentence every reader gives; a service answers its probes
// with it.
func ExampleCache_Status() {
	c, err := shmcache.Attach(cacheName)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status()
	if err != nil {
		log.Fatal(err)
	}
	code := http.StatusOK
	if !st.Ready {
		code = http.StatusServiceUnavailable
	}
	fmt.Println(code, st.Reason, st.Why)
	// Output:
	// 503 no-supervisor no live supervisor
}
