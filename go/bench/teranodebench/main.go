// Command teranodebench is the Go side of bench/test_teranode.py: a Teranode service's
// txmeta cache, as go/txmeta over one shared shmcache cache or as a private
// VictoriaMetrics/fastcache (what Teranode's txmetacache forks), on the same entries. It
// lives in the bench module (go/bench) so that fastcache is never a dependency of the
// reader's module.
//
//	teranodebench attach NAME KEYS                       look every key up; "ready HITS"; wait for EOF
//	teranodebench fastcache KEYS OFFSETS VALUES          a private fastcache of the entries, looked up: "ready HITS"; wait for EOF
//	teranodebench loop NAME KEYS OFFSETS VALUES ROUNDS MS   the lookup-and-decode loop, both ways: JSON lines
//	teranodebench serve NAME KEYS                        attach, wait ready, decorate one batch: "serving HITS"
//
// KEYS: n 32-byte keys back to back; OFFSETS: n + 1 int64 LE, value i is
// VALUES[OFFSETS[i]:OFFSETS[i+1]] (what bench/test_teranode.py writes).
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/fastcache"
	"github.com/shmcache/shmcache/go/txmeta"
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "teranodebench: "+format+"\n", args...)
	os.Exit(2)
}

func read(path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		fail("%v", err)
	}
	return b
}

func keysOf(path string) [][32]byte {
	raw := read(path)
	keys := make([][32]byte, len(raw)/32)
	for i := range keys {
		copy(keys[i][:], raw[i*32:])
	}
	return keys
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: see the package comment")
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "attach":
		c := attach(args[0])
		holding(batches(keysOf(args[1]), shmcacheLookup(c)))
		runtime.KeepAlive(c)
	case "fastcache":
		fc, keys := fill(args[0], args[1], args[2])
		holding(batches(keys, fastcacheLookup(fc)))
		runtime.KeepAlive(fc)
	case "loop":
		rounds, _ := strconv.Atoi(args[4])
		ms, _ := strconv.Atoi(args[5])
		loop(attach(args[0]), args[1], args[2], args[3], rounds, time.Duration(ms)*time.Millisecond)
	case "serve":
		serve(args[0], args[1])
	default:
		fail("unknown mode %q", os.Args[1])
	}
}

// holding says "ready HITS" once only the cache is held (the keys and files read are
// garbage, collected and handed back to the OS, so PSS counts the cache and the runtime),
// and holds it until stdin ends.
func holding(hits int) {
	runtime.GC()
	debug.FreeOSMemory()
	fmt.Println("ready", hits)
	io.Copy(io.Discard, os.Stdin)
}

func attach(name string) *txmeta.Cache {
	c, err := txmeta.Attach(name)
	if err != nil {
		fail("%v", err)
	}
	return c
}

// fill makes a private fastcache of the entries, as a service without shmcache holds them.
func fill(keysPath, offsetsPath, valuesPath string) (*fastcache.Cache, [][32]byte) {
	keys := keysOf(keysPath)
	raw, values := read(offsetsPath), read(valuesPath)
	off := func(i int) int { return int(binary.LittleEndian.Uint64(raw[8*i:])) }
	fc := fastcache.New(max(32<<20, 2*len(values)+2*32*len(keys)))
	for i := range keys {
		fc.Set(keys[i][:], values[off(i):off(i+1)])
	}
	return fc, keys
}

// lookup is one batch of lookups and decodes, either way: its hits.
type lookup func(keys [][32]byte) (hits int)

func shmcacheLookup(c *txmeta.Cache) lookup {
	var b txmeta.Batch
	ctx := context.Background()
	return func(keys [][32]byte) int {
		if err := txmeta.GetMetaCachedBatch(ctx, c, keys, &b); err != nil {
			fail("%v", err)
		}
		return b.Hits
	}
}

// fastcacheLookup is Get of each key into one reused buffer and the same decode into a
// reused Meta a key, as GetMetaCachedBatch does after its lookup.
func fastcacheLookup(fc *fastcache.Cache) lookup {
	metas := make([]txmeta.Meta, txmeta.BatchSize)
	outcomes := make([]txmeta.Outcome, txmeta.BatchSize)
	var dst []byte
	return func(keys [][32]byte) int {
		if len(metas) < len(keys) {
			metas = append(metas, make([]txmeta.Meta, len(keys)-len(metas))...)
			outcomes = make([]txmeta.Outcome, len(keys))
		}
		hits := 0
		for i := range keys {
			var ok bool
			dst, ok = fc.HasGet(dst[:0], keys[i][:])
			m := &metas[i]
			switch {
			case !ok:
				m.Reset()
				outcomes[i] = txmeta.Miss
			case m.Decode(dst) != nil:
				outcomes[i] = txmeta.Malformed
			default:
				outcomes[i] = txmeta.Hit
				hits++
			}
		}
		return hits
	}
}

// batches looks keys up a batch at a time: the hits.
func batches(keys [][32]byte, f lookup) (hits int) {
	for i := 0; i < len(keys); i += txmeta.BatchSize {
		hits += f(keys[i:min(i+txmeta.BatchSize, len(keys))])
	}
	return hits
}

// result is one timed run of the loop, a JSON line.
type result struct {
	Impl           string  `json:"impl"`
	Goroutines     int     `json:"goroutines"`
	Round          int     `json:"round"`
	Batches        int64   `json:"batches"`
	Hits           int64   `json:"hits"`
	HashesPerS     float64 `json:"hashes_per_s"`
	HashesPerCPUS  float64 `json:"hashes_per_cpu_s"` // over the process's CPU time: what a host's load takes away is left out
	AllocsPerBatch float64 `json:"allocs_per_batch"`
}

// cpuSeconds is the process's user and system time so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		fail("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// timed runs g goroutines, each with its own lookup (its own Batch or buffers) over its own
// stretch of the keys in batches of 1,024, for d; rate and allocations per batch.
func timed(impl string, g int, d time.Duration, keys [][32]byte, newLookup func() lookup) result {
	fs := make([]lookup, g)
	for j := range fs {
		fs[j] = newLookup()
		batches(keys[:min(len(keys), 4*txmeta.BatchSize)], fs[j]) // buffers grown before the clock
	}
	n := len(keys) / txmeta.BatchSize
	counts := make([][2]int64, g) // batches, hits
	var wg sync.WaitGroup
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cpu0 := cpuSeconds()
	start := time.Now()
	deadline := start.Add(d)
	for j := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pos := j * n / g
			for time.Now().Before(deadline) {
				for range 16 {
					b := pos % n
					h := fs[j](keys[b*txmeta.BatchSize : (b+1)*txmeta.BatchSize])
					counts[j][1] += int64(h)
					counts[j][0]++
					pos++
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuSeconds() - cpu0
	runtime.ReadMemStats(&after)
	r := result{Impl: impl, Goroutines: g}
	for _, c := range counts {
		r.Batches += c[0]
		r.Hits += c[1]
	}
	r.HashesPerS = float64(r.Batches*txmeta.BatchSize) / elapsed.Seconds()
	r.HashesPerCPUS = float64(r.Batches*txmeta.BatchSize) / cpu
	r.AllocsPerBatch = float64(after.Mallocs-before.Mallocs) / float64(r.Batches)
	return r
}

// loop times shmcache and fastcache on 1 and 2 goroutines, rounds times each, alternating
// which goes first, and prints a JSON line a run.
func loop(c *txmeta.Cache, keysPath, offsetsPath, valuesPath string, rounds int, d time.Duration) {
	fc, keys := fill(keysPath, offsetsPath, valuesPath)
	if len(keys) < txmeta.BatchSize {
		fail("%d keys: at least a batch of %d is needed", len(keys), txmeta.BatchSize)
	}
	impls := map[string]func() lookup{
		"shmcache":  func() lookup { return shmcacheLookup(c) },
		"fastcache": func() lookup { return fastcacheLookup(fc) },
	}
	out := json.NewEncoder(os.Stdout)
	for r := range rounds {
		for _, g := range []int{1, 2} {
			order := []string{"shmcache", "fastcache"}
			if r%2 == 1 {
				order[0], order[1] = order[1], order[0]
			}
			for _, impl := range order {
				res := timed(impl, g, d, keys, impls[impl])
				res.Round = r
				out.Encode(res)
			}
		}
	}
}

// serve is a service's start on an existing cache: attach, wait until ready, decorate the
// first batch. The parent times it from the process's spawn to the "serving" line.
func serve(name, keysPath string) {
	c := attach(name)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		fail("%v", err)
	}
	keys := keysOf(keysPath)
	hits := shmcacheLookup(c)(keys[:min(len(keys), txmeta.BatchSize)])
	w := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(w, "serving", hits)
	w.Flush()
}
