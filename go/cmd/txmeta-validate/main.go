// Command txmeta-validate plays Teranode's subtree validation loop against a shmcache
// txmeta cache: it takes tx hashes (a file, or generated), decorates them with their
// metadata in batches of 1,024 from N goroutines, as processTxMetaUsingCache does, and
// reports hits, misses and malformed entries and the rate.
//
//	txmeta-validate -cache txmeta -owner shmcache -hashes subtree.bin -goroutines 2
//	txmeta-validate -cache txmeta -generate 1000000 -rounds 5 -json
//
// -hashes FILE: 32-byte hashes back to back (-format bin), or one 64-digit hex hash a line
// (-format hex), each the key's bytes as they are (not chainhash's reversed display order).
// -wait D waits up to D for the cache to be ready first (exit 1 if it is not). -outcomes
// FILE writes one letter a hash, in order (h hit, m miss, x malformed); -owner refuses a
// cache another user owns. The report is a line of text, or of JSON with -json. A bad
// argument or a cache that cannot be read: one line on stderr, "txmeta-validate: KIND:
// message" with the readers' contract's word, and exit 2.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	shmcache "github.com/shmcache/shmcache/go"
	"github.com/shmcache/shmcache/go/txmeta"
)

type options struct {
	cache, owner, hashes, format string
	outcomes                     string
	generate, goroutines, batch  int
	rounds                       int
	seed                         uint64
	wait                         time.Duration
	json                         bool
}

// Report is what a run found; its JSON names are those of -json.
type Report struct {
	Cache      string             `json:"cache"`
	Hashes     int                `json:"hashes"` // a round
	Rounds     int                `json:"rounds"`
	Goroutines int                `json:"goroutines"`
	Batch      int                `json:"batch"`
	Hits       int64              `json:"hits"` // over every round
	Misses     int64              `json:"misses"`
	Malformed  int64              `json:"malformed"`
	FeeSum     uint64             `json:"fee_sum"` // the hits' fees, modulo 2**64: a check of the decode
	Parents    int64              `json:"parents"` // the hits' parents
	Seconds    float64            `json:"seconds"`
	Rate       float64            `json:"hashes_per_s"`
	Health     health             `json:"health"`
	Stats      *txmeta.CacheStats `json:"stats"`
}

type health struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "txmeta-validate: "+format+"\n", args...)
	os.Exit(2)
}

// failErr is fail for a reader's error: the contract's KIND word, then the message.
func failErr(err error) {
	kind := shmcache.Kind(err)
	if kind == "" {
		kind = "error"
	}
	fail("%s: %v", kind, err)
}

func main() {
	var o options
	flag.StringVar(&o.cache, "cache", "txmeta", "the cache's name")
	flag.StringVar(&o.owner, "owner", "", "refuse a cache another user owns (a user name or uid)")
	flag.StringVar(&o.hashes, "hashes", "", "a file of tx hashes (see -format)")
	flag.StringVar(&o.format, "format", "bin", "the -hashes file: bin (32 bytes each) or hex (a hash a line)")
	flag.IntVar(&o.generate, "generate", 0, "without -hashes: this many generated hashes (mostly misses)")
	flag.Uint64Var(&o.seed, "seed", 46, "the generated hashes' seed")
	flag.IntVar(&o.goroutines, "goroutines", 2, "goroutines decorating batches")
	flag.IntVar(&o.batch, "batch", txmeta.BatchSize, "hashes a batch")
	flag.IntVar(&o.rounds, "rounds", 1, "times through the hashes")
	flag.DurationVar(&o.wait, "wait", 0, "wait this long for the cache to be ready first (0: do not wait)")
	flag.StringVar(&o.outcomes, "outcomes", "", "write a letter a hash here (h, m, x), in order")
	flag.BoolVar(&o.json, "json", false, "report as one line of JSON")
	flag.Parse()
	switch {
	case flag.NArg() != 0:
		fail("bad-argument: unexpected arguments %q", flag.Args())
	case (o.hashes == "") == (o.generate == 0):
		fail("bad-argument: give -hashes FILE or -generate N (one of them)")
	case o.generate < 0 || o.goroutines < 1 || o.batch < 1 || o.rounds < 1:
		fail("bad-argument: -generate, -goroutines, -batch and -rounds must be positive")
	case o.format != "bin" && o.format != "hex":
		fail("bad-argument: -format is bin or hex, not %q", o.format)
	}
	hashes, err := load(o)
	if err != nil {
		fail("bad-argument: %v", err)
	}
	var opts []shmcache.Option
	if o.owner != "" {
		opts = append(opts, shmcache.WithOwner(o.owner))
	}
	c, err := txmeta.Attach(o.cache, opts...)
	if err != nil {
		failErr(err)
	}
	defer c.Close()
	ctx := context.Background()
	if o.wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, o.wait)
		err := c.WaitReady(wctx)
		cancel()
		if errors.Is(err, shmcache.ErrNotReady) {
			fmt.Fprintf(os.Stderr, "txmeta-validate: not-ready: %v\n", err)
			os.Exit(1)
		} else if err != nil {
			failErr(err)
		}
	}
	r, outcomes, err := run(ctx, c, hashes, o)
	if err != nil {
		failErr(err)
	}
	if o.outcomes != "" {
		letters := make([]byte, len(outcomes))
		for i, x := range outcomes {
			letters[i] = letter[x]
		}
		if err := os.WriteFile(o.outcomes, letters, 0o644); err != nil {
			fail("bad-argument: -outcomes: %v", err)
		}
	}
	if o.json {
		out, _ := json.Marshal(r)
		fmt.Println(string(out))
		return
	}
	fmt.Printf("%s: %d hashes x %d rounds on %d goroutines in batches of %d: %d hits, %d misses, "+
		"%d malformed in %.3f s (%.2f M hashes/s); health %d %s\n", r.Cache, r.Hashes, r.Rounds, r.Goroutines,
		r.Batch, r.Hits, r.Misses, r.Malformed, r.Seconds, r.Rate/1e6, r.Health.Code, r.Health.Message)
}

var letter = [...]byte{txmeta.Hit: 'h', txmeta.Miss: 'm', txmeta.Malformed: 'x'}

// load reads or generates the hashes.
func load(o options) ([][32]byte, error) {
	if o.hashes == "" {
		out := make([][32]byte, o.generate)
		var seed [16]byte
		binary.LittleEndian.PutUint64(seed[:], o.seed)
		for i := range out {
			binary.LittleEndian.PutUint64(seed[8:], uint64(i))
			out[i] = sha256.Sum256(seed[:])
		}
		return out, nil
	}
	raw, err := os.ReadFile(o.hashes)
	if err != nil {
		return nil, err
	}
	if o.format == "bin" {
		if len(raw)%txmeta.HashSize != 0 {
			return nil, fmt.Errorf("%s is %d bytes, not a whole number of 32-byte hashes", o.hashes, len(raw))
		}
		out := make([][32]byte, len(raw)/txmeta.HashSize)
		for i := range out {
			copy(out[i][:], raw[i*txmeta.HashSize:])
		}
		return out, nil
	}
	var out [][32]byte
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for line := 1; sc.Scan(); line++ {
		s := bytes.TrimSpace(sc.Bytes())
		if len(s) == 0 {
			continue
		}
		var h [32]byte
		if n, err := hex.Decode(h[:], s); err != nil || n != txmeta.HashSize || len(s) != 2*txmeta.HashSize {
			return nil, fmt.Errorf("%s line %d: %q is not a 64-digit hex hash", o.hashes, line, s)
		}
		out = append(out, h)
	}
	return out, nil
}

// run decorates every batch of hashes, rounds times, from o.goroutines goroutines that take
// the batches in turn (processTxMetaUsingCache's errgroup over batches); each goroutine
// reuses one Batch. It returns the last round's outcomes too, in order.
func run(ctx context.Context, c *txmeta.Cache, hashes [][32]byte, o options) (*Report, []txmeta.Outcome, error) {
	r := &Report{Cache: c.Name(), Hashes: len(hashes), Rounds: o.rounds, Goroutines: o.goroutines, Batch: o.batch}
	outcomes := make([]txmeta.Outcome, len(hashes))
	batches := (len(hashes) + o.batch - 1) / o.batch
	total := int64(batches * o.rounds)
	var (
		next, hits, misses, malformed, parents atomic.Int64
		fees                                   atomic.Uint64
		errOnce                                sync.Once
		firstErr                               error
		wg                                     sync.WaitGroup
	)
	t0 := time.Now()
	for range o.goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b txmeta.Batch
			var h, p int64
			var f uint64
			for k := next.Add(1) - 1; k < total; k = next.Add(1) - 1 {
				lo := int(k%int64(batches)) * o.batch
				hi := min(lo+o.batch, len(hashes))
				if err := txmeta.GetMetaCachedBatch(ctx, c, hashes[lo:hi], &b); err != nil {
					errOnce.Do(func() { firstErr = err })
					next.Store(total) // the others stop too
					break
				}
				for i, x := range b.Outcomes {
					if x == txmeta.Hit {
						f += b.Metas[i].Fee
						p += int64(len(b.Metas[i].Parents))
					}
				}
				h += int64(b.Hits)
				misses.Add(int64(b.Misses))
				malformed.Add(int64(b.Malformed))
				if k >= total-int64(batches) { // the last round
					copy(outcomes[lo:hi], b.Outcomes)
				}
			}
			hits.Add(h)
			parents.Add(p)
			fees.Add(f)
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, nil, firstErr
	}
	r.Seconds = time.Since(t0).Seconds()
	r.Rate = float64(len(hashes)*o.rounds) / r.Seconds
	r.Hits, r.Misses, r.Malformed = hits.Load(), misses.Load(), malformed.Load()
	r.FeeSum, r.Parents = fees.Load(), parents.Load()
	code, msg, _ := c.Health(ctx, false)
	r.Health = health{Code: code, Message: msg}
	if st, err := c.Stats(); err == nil {
		r.Stats = st
	}
	return r, outcomes, nil
}
