package txmeta

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	shmcache "github.com/shmcache/shmcache/go"
)

// python is the repo's virtualenv interpreter; the tests that need a real writer skip,
// saying so, without it.
func python(t *testing.T) string {
	p, _ := filepath.Abs("../../.venv/bin/python")
	if env := os.Getenv("SHMCACHE_PYTHON"); env != "" {
		p = env
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no Python with shmcache at %s (run scripts/setup, or set SHMCACHE_PYTHON)", p)
	}
	return p
}

func caseKey(i int) [32]byte { return sha256.Sum256([]byte(fmt.Sprintf("txmeta go test %d", i))) }

// generated is how many Teranode-shaped values testdata/fill.py writes besides the goldens.
const generated = 64 * BatchSize

func generatedKey(i int) [32]byte {
	return sha256.Sum256([]byte(fmt.Sprintf("txmeta go test generated %d", i)))
}

// filled is a cache that testdata/fill.py filled with every golden value (case i at
// caseKey(i)) and generated Teranode-shaped ones; stop() has the writer destroy it. The writer is killed by pid and the
// cache's files removed when the test ends.
type filled struct {
	name  string
	cases []goldenCase
	stdin io.WriteCloser
	cmd   *exec.Cmd
}

func fillGoldens(t *testing.T) *filled {
	f := &filled{name: fmt.Sprintf("txmeta-go-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-")),
		cases: goldenCases(t)}
	f.cmd = exec.Command(python(t), "testdata/fill.py", f.name, goldenPath, fmt.Sprint(generated))
	f.stdin, _ = f.cmd.StdinPipe()
	out, _ := f.cmd.StdoutPipe()
	f.cmd.Stderr = os.Stderr
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.stdin.Close()
		if f.cmd.ProcessState == nil {
			f.cmd.Process.Kill() // by pid: only the process this test started
			f.cmd.Wait()
		}
		os.Remove("/dev/shm/" + f.name)
		os.Remove("/dev/shm/.shmcache-" + f.name + ".readers")
	})
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("testdata/fill.py did not fill cache %s: %q", f.name, lines.Text())
	}
	return f
}

// stop has the writer destroy the cache and waits for it to exit.
func (f *filled) stop(t *testing.T) {
	f.stdin.Close()
	if err := f.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

func (f *filled) keys(absent int) [][32]byte {
	keys := make([][32]byte, 0, len(f.cases)+absent)
	for i := range f.cases {
		keys = append(keys, caseKey(i))
	}
	for i := range absent {
		keys = append(keys, sha256.Sum256([]byte(fmt.Sprintf("txmeta go test absent %d", i))))
	}
	return keys
}

// want is the outcome of case i with the tip at tip and keep blocks kept: the horizon rule
// applied to the golden decode.
func (f *filled) want(i int, tip, keep uint32) Outcome {
	if i >= len(f.cases) {
		return Miss
	}
	c := &f.cases[i]
	switch {
	case !c.valid():
		return Malformed
	case c.Expect.BlockHeight != nil && tip > keep && *c.Expect.BlockHeight < tip-keep:
		return Old
	}
	return Hit
}

// Every golden value read through the cache: valid ones decode as expected, malformed
// ones are Malformed, absent keys Miss; then the horizon makes the old ones Old, in a batch
// and one hash at a time, and the counts of each land in the Batch and in GetCacheStats.
func TestGoldenValuesThroughTheCache(t *testing.T) {
	f := fillGoldens(t)
	c, err := Attach(f.name, Config{GlobalBlockHeightRetention: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.BlocksToKeep() != 100 {
		t.Fatalf("BlocksToKeep %d, want a tenth of 1000", c.BlocksToKeep())
	}
	keys := f.keys(50)
	ctx := context.Background()
	var b Batch
	var m Meta
	var total [4]int
	for _, tip := range []uint32{0, 100, 850_100, 900_101, 1<<32 - 1} { // 0 and 100: no horizon yet
		if err := c.SetBlockHeight(tip); err != nil || c.GetBlockHeight() != tip {
			t.Fatal(err)
		}
		if err := GetMetaCachedBatch(ctx, c, keys, &b); err != nil {
			t.Fatal(err)
		}
		var counts [4]int
		for i := range keys {
			want := f.want(i, tip, c.BlocksToKeep())
			counts[want]++
			if b.Outcomes[i] != want {
				t.Errorf("tip %d: %s: %v, want %v", tip, f.cases[min(i, len(f.cases)-1)].Name, b.Outcomes[i], want)
				continue
			}
			if want == Hit || want == Old {
				if diff := sameAsExpected(&f.cases[i], &b.Metas[i]); diff != "" {
					t.Errorf("%s: %s differ from the golden decode", f.cases[i].Name, diff)
				}
			}
			if (b.Meta(i) != nil) != (want == Hit) {
				t.Errorf("%s: Meta(i) is %v for %v", f.cases[min(i, len(f.cases)-1)].Name, b.Meta(i), want)
			}
			o, err := c.GetMetaCached(ctx, keys[i], &m) // one at a time: the same outcome and decode
			if err != nil || o != want {
				t.Errorf("tip %d: GetMetaCached of key %d: %v %v, want %v", tip, i, o, err, want)
			} else if want == Hit && sameAsExpected(&f.cases[i], &m) != "" {
				t.Errorf("%s: GetMetaCached decoded otherwise", f.cases[i].Name)
			}
		}
		if got := [4]int{b.Misses, b.Hits, b.Old, b.Malformed}; got != counts {
			t.Errorf("tip %d: the batch counts miss/hit/old/malformed %v, want %v", tip, got, counts)
		}
		if tip == 850_100 && (counts[Old] == 0 || counts[Hit] == 0) {
			t.Fatalf("the tip %d should make some golden values old and keep others: %v", tip, counts)
		}
		for k := range total {
			total[k] += 2 * counts[k] // the batch and the single lookups
		}
	}
	st, err := c.GetCacheStats()
	if err != nil {
		t.Fatal(err)
	}
	if got := [4]uint64{st.Misses, st.Hits, st.HitOldTx, st.Malformed}; got != [4]uint64{
		uint64(total[0]), uint64(total[1]), uint64(total[2]), uint64(total[3])} {
		t.Errorf("GetCacheStats miss/hit/old/malformed %v, want %v", got, total)
	}
	if st.EntriesCount != uint64(len(f.cases)+generated) || st.TotalElementsAdded < st.EntriesCount || st.Evictions != 0 {
		t.Errorf("GetCacheStats: %+v, for %d entries set", st, len(f.cases))
	}
}

// Teranode's rule: a tenth of the retention, at least one block.
func TestBlocksToKeep(t *testing.T) {
	for retention, want := range map[uint32]uint32{0: 1, 9: 1, 10: 1, 19: 1, 20: 2, 288: 28, 1<<32 - 1: 429496729} {
		if got := BlocksToKeep(retention); got != want {
			t.Errorf("BlocksToKeep(%d) = %d, want %d", retention, got, want)
		}
	}
}

// A batch of 1,024 hashes, hits and misses, allocates nothing once its Batch has grown:
// the same batch again, and Teranode-shaped batches it has not met (whose values are larger
// than what a slot held before).
func TestBatchAllocatesNothing(t *testing.T) {
	f := fillGoldens(t)
	c, err := Attach(f.name, Config{GlobalBlockHeightRetention: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetBlockHeight(850_100)
	keys := f.keys(BatchSize)[:len(f.cases)]
	hashes := make([][32]byte, BatchSize)
	for i := range hashes {
		hashes[i] = keys[(i*7)%len(keys)]
	}
	ctx := context.Background()
	var b Batch
	var m Meta
	for range 2 {
		if err := GetMetaCachedBatch(ctx, c, hashes, &b); err != nil {
			t.Fatal(err)
		}
	}
	if b.Hits == 0 || b.Old == 0 || b.Malformed == 0 {
		t.Fatalf("the batch should mix outcomes: %d hits, %d old, %d malformed", b.Hits, b.Old, b.Malformed)
	}
	if a := testing.AllocsPerRun(50, func() { _ = GetMetaCachedBatch(ctx, c, hashes, &b) }); a != 0 {
		t.Errorf("GetMetaCachedBatch of the same %d hashes again: %v allocations", BatchSize, a)
	}
	for _, h := range hashes {
		c.GetMetaCached(ctx, h, &m)
	}
	if a := testing.AllocsPerRun(50, func() { _, _ = c.GetMetaCached(ctx, hashes[3], &m) }); a != 0 && !raceEnabled {
		t.Errorf("GetMetaCached: %v allocations", a)
	}

	gen := make([][32]byte, generated)
	for i := range gen {
		gen[i] = generatedKey(i)
	}
	var fresh Batch
	if err := GetMetaCachedBatch(ctx, c, gen[:BatchSize], &fresh); err != nil || fresh.Hits+fresh.Old != BatchSize {
		t.Fatalf("the generated values: %v, %d hits and %d old of %d", err, fresh.Hits, fresh.Old, BatchSize)
	}
	next := 1
	a := testing.AllocsPerRun(generated/BatchSize-2, func() {
		_ = GetMetaCachedBatch(ctx, c, gen[next*BatchSize:(next+1)*BatchSize], &fresh)
		next++
	})
	if a != 0 || fresh.Hits+fresh.Old != BatchSize {
		t.Errorf("batches of Teranode-shaped values not met before: %v allocations a batch (%d found)", a,
			fresh.Hits+fresh.Old)
	}
}

// hash is a type of its own with [32]byte's layout, as chainhash.Hash is.
type hash [32]byte

// Keys is the hashes' own memory, whatever their named type: nothing is copied.
func TestKeysIsAViewOfTheHashes(t *testing.T) {
	hs := []hash{{1}, {2}, {3}}
	k := Keys(hs)
	if len(k) != 3*HashSize || unsafe.Pointer(&k[0]) != unsafe.Pointer(&hs[0][0]) || k[64] != 3 {
		t.Fatalf("Keys is not a view of the hashes: %d bytes", len(k))
	}
	if Keys([]hash{}) != nil || Keys[hash](nil) != nil {
		t.Fatal("no hashes: no keys")
	}
}

// A batch of a named hash type finds what [][32]byte finds.
func TestNamedHashType(t *testing.T) {
	f := fillGoldens(t)
	c, err := Attach(f.name, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := f.keys(3)
	named := make([]hash, len(keys))
	for i := range keys {
		named[i] = keys[i]
	}
	var a, b Batch
	ctx := context.Background()
	if err := GetMetaCachedBatch(ctx, c, keys, &a); err != nil {
		t.Fatal(err)
	}
	if err := GetMetaCachedBatch(ctx, c, named, &b); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(a.Outcomes) != fmt.Sprint(b.Outcomes) || a.Hits == 0 || b.Misses != 3 {
		t.Fatalf("%v against %v", a.Outcomes, b.Outcomes)
	}
}

// Health: live while the cache is readable, not ready (503, and why) without a supervisor
// keeping it filled; once the cache is destroyed, 503 with the reader's error, both ways.
// A lookup after ctx's end is its error.
func TestHealthAndContext(t *testing.T) {
	f := fillGoldens(t)
	c, err := Attach(f.name, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if code, msg, err := c.Health(ctx, true); code != http.StatusOK || err != nil || !strings.Contains(msg, f.name) {
		t.Errorf("liveness: %d %q %v", code, msg, err)
	}
	code, msg, err := c.Health(ctx, false)
	if code != http.StatusServiceUnavailable || err != nil || !strings.Contains(msg, "not ready (no-supervisor): no live supervisor") ||
		!strings.Contains(msg, f.name) {
		t.Errorf("readiness without a supervisor: %d %q %v", code, msg, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err = c.WaitReady(wctx)
	cancel()
	if !errors.Is(err, shmcache.ErrNotReady) || !strings.Contains(err.Error(), "no live supervisor") {
		t.Errorf("WaitReady without a supervisor: %v", err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	var b Batch
	var m Meta
	// ctx's end is the reader's kind of error (docs/go.md, Errors): not-ready, caused by the context
	ended := func(err error) bool {
		var e *shmcache.Error
		return errors.Is(err, context.Canceled) && errors.Is(err, shmcache.ErrNotReady) &&
			shmcache.Kind(err) == "not-ready" && errors.As(err, &e) && strings.Contains(err.Error(), f.name)
	}
	if err := GetMetaCachedBatch(done, c, f.keys(1), &b); !ended(err) {
		t.Errorf("a batch after ctx's end: %v", err)
	}
	if _, err := c.GetMetaCached(done, caseKey(0), &m); !ended(err) {
		t.Errorf("a lookup after ctx's end: %v", err)
	}
	if code, _, err := c.Health(done, false); code != http.StatusServiceUnavailable || !ended(err) {
		t.Errorf("health after ctx's end: %d %v", code, err)
	}

	f.stop(t) // the writer destroys the cache; the handle follows the name
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, msg, err := c.Health(ctx, true)
		if errors.Is(err, shmcache.ErrNotFound) {
			if code != http.StatusServiceUnavailable || !strings.Contains(msg, f.name) {
				t.Errorf("liveness of a destroyed cache: %d %q", code, msg)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("liveness still %d %q %v 10 s after the cache was destroyed", code, msg, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _, err := c.Health(ctx, false); code != http.StatusServiceUnavailable || !errors.Is(err, shmcache.ErrNotFound) {
		t.Errorf("readiness of a destroyed cache: %d %v", code, err)
	}
	if err := GetMetaCachedBatch(ctx, c, f.keys(1), &b); !errors.Is(err, shmcache.ErrNotFound) {
		t.Errorf("a batch on a destroyed cache: %v", err)
	}
	if _, err := c.GetCacheStats(); !errors.Is(err, shmcache.ErrNotFound) {
		t.Errorf("stats of a destroyed cache: %v", err)
	}
}

// TestCloseOfAFailedAttachIsNothing: the package example's `defer c.Close()` after a failed
// Attach (a nil *Cache) returns nil instead of panicking, as the reader's Close does.
func TestCloseOfAFailedAttachIsNothing(t *testing.T) {
	c, err := Attach("t-txmeta-no-such-cache-"+t.Name(), Config{})
	if err == nil || c != nil {
		t.Fatalf("Attach of no cache: %v, %v", c, err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close of a nil *Cache: %v", err)
	}
}
