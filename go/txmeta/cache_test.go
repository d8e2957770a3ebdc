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
	"strings"
	"testing"
	"time"
	"unsafe"

	shmcache "github.com/shmcache/shmcache/go"
	"github.com/shmcache/shmcache/go/internal/goldencache"
	"github.com/shmcache/shmcache/go/internal/testpython"
)

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
	f.cmd = exec.Command(testpython.Path(t), "testdata/fill.py", f.name, goldenPath, fmt.Sprint(generated))
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

// want is the outcome of case i: Hit for a valid golden value (with a block height or
// not: nothing is old), Malformed for a malformed one, Miss past the goldens.
func (f *filled) want(i int) Outcome {
	if i >= len(f.cases) {
		return Miss
	}
	if !f.cases[i].valid() {
		return Malformed
	}
	return Hit
}

// Every golden value read through the cache: valid ones decode as expected (those with a
// block height too: there is no horizon), malformed ones are Malformed, absent keys Miss;
// in a batch, one hash at a time into a Meta (Lookup) and with Teranode's results
// (GetMetaCached); the counts of each land in the Batch and in GetCacheStats.
func TestGoldenValuesThroughTheCache(t *testing.T) {
	f := fillGoldens(t)
	c, err := Attach(f.name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := f.keys(50)
	ctx := context.Background()
	var b Batch
	var m Meta
	if err := GetMetaCachedBatch(ctx, c, keys, &b); err != nil {
		t.Fatal(err)
	}
	var counts [3]int
	heights := 0
	for i := range keys {
		want := f.want(i)
		counts[want]++
		name := f.cases[min(i, len(f.cases)-1)].Name
		if b.Outcomes[i] != want {
			t.Errorf("%s: %v, want %v", name, b.Outcomes[i], want)
			continue
		}
		if want == Hit {
			if diff := sameAsExpected(&f.cases[i], &b.Metas[i]); diff != "" {
				t.Errorf("%s: %s differ from the golden decode", name, diff)
			}
			if b.Metas[i].HasHeight {
				heights++
			}
		}
		if (b.Meta(i) != nil) != (want == Hit) {
			t.Errorf("%s: Meta(i) is %v for %v", name, b.Meta(i), want)
		}
		o, err := c.Lookup(ctx, keys[i], &m) // one at a time: the same outcome and decode
		if err != nil || o != want {
			t.Errorf("Lookup of key %d: %v %v, want %v", i, o, err, want)
		} else if want == Hit && sameAsExpected(&f.cases[i], &m) != "" {
			t.Errorf("%s: Lookup decoded otherwise", name)
		}
		got, err := c.GetMetaCached(ctx, keys[i]) // Teranode's results
		switch want {
		case Hit:
			if err != nil || got == nil || sameAsExpected(&f.cases[i], got) != "" {
				t.Errorf("%s: GetMetaCached of a hit: %v, %v", name, got, err)
			}
		case Miss:
			if got != nil || err != nil {
				t.Errorf("GetMetaCached of absent key %d: %v, %v, want nil, nil", i, got, err)
			}
		case Malformed:
			var me *MalformedError
			if got != nil || !errors.Is(err, ErrMalformed) || !errors.As(err, &me) {
				t.Errorf("%s: GetMetaCached of a malformed value: %v, %v", name, got, err)
			}
		}
	}
	if got := [3]int{b.Misses, b.Hits, b.Malformed}; got != counts {
		t.Errorf("the batch counts miss/hit/malformed %v, want %v", got, counts)
	}
	if heights == 0 || counts[Hit] == heights || counts[Malformed] == 0 {
		t.Fatalf("the goldens should hold hits with and without a height, and malformed values: %v, %d heights",
			counts, heights)
	}
	st := c.GetCacheStats()
	if got := [3]uint64{st.Misses, st.Hits, st.Malformed}; got != [3]uint64{
		3 * uint64(counts[0]), 3 * uint64(counts[1]), 3 * uint64(counts[2])} {
		t.Errorf("GetCacheStats miss/hit/malformed %v, want 3 x %v (batch, Lookup, GetMetaCached)", got, counts)
	}
	if st.EntriesCount != uint64(len(f.cases)+generated) || st.TotalElementsAdded < st.EntriesCount || st.Evictions != 0 {
		t.Errorf("GetCacheStats: %+v, for %d entries set", st, len(f.cases))
	}
}

// A batch of 1,024 hashes, hits and misses, allocates nothing once its Batch has grown:
// the same batch again, and Teranode-shaped batches it has not met (whose values are larger
// than what a slot held before).
func TestBatchAllocatesNothing(t *testing.T) {
	f := fillGoldens(t)
	c, err := Attach(f.name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
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
	if b.Hits == 0 || b.Misses != 0 || b.Malformed == 0 {
		t.Fatalf("the batch should mix outcomes: %d hits, %d malformed", b.Hits, b.Malformed)
	}
	if a := testing.AllocsPerRun(50, func() { _ = GetMetaCachedBatch(ctx, c, hashes, &b) }); a != 0 {
		t.Errorf("GetMetaCachedBatch of the same %d hashes again: %v allocations", BatchSize, a)
	}
	for _, h := range hashes {
		c.Lookup(ctx, h, &m)
	}
	if a := testing.AllocsPerRun(50, func() { _, _ = c.Lookup(ctx, hashes[3], &m) }); a != 0 && !raceEnabled {
		t.Errorf("Lookup: %v allocations", a)
	}

	gen := make([][32]byte, generated)
	for i := range gen {
		gen[i] = generatedKey(i)
	}
	var fresh Batch
	if err := GetMetaCachedBatch(ctx, c, gen[:BatchSize], &fresh); err != nil || fresh.Hits != BatchSize {
		t.Fatalf("the generated values: %v, %d hits of %d", err, fresh.Hits, BatchSize)
	}
	next := 1
	a := testing.AllocsPerRun(generated/BatchSize-2, func() {
		_ = GetMetaCachedBatch(ctx, c, gen[next*BatchSize:(next+1)*BatchSize], &fresh)
		next++
	})
	if a != 0 || fresh.Hits != BatchSize {
		t.Errorf("batches of Teranode-shaped values not met before: %v allocations a batch (%d found)", a,
			fresh.Hits)
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
	c, err := Attach(f.name)
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
	c, err := Attach(f.name)
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
	if _, err := c.Lookup(done, caseKey(0), &m); !ended(err) {
		t.Errorf("a lookup after ctx's end: %v", err)
	}
	if got, err := c.GetMetaCached(done, caseKey(0)); got != nil || !ended(err) {
		t.Errorf("GetMetaCached after ctx's end: %v, %v", got, err)
	}
	if code, _, err := c.Health(done, false); code != http.StatusServiceUnavailable || !ended(err) {
		t.Errorf("health after ctx's end: %d %v", code, err)
	}

	if err := GetMetaCachedBatch(ctx, c, f.keys(1), &b); err != nil || b.Hits == 0 {
		t.Fatalf("a batch before the cache is destroyed: %v, %d hits", err, b.Hits)
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
	if _, err := c.Stats(); !errors.Is(err, shmcache.ErrNotFound) {
		t.Errorf("stats of a destroyed cache: %v", err)
	}
	if got, err := c.GetMetaCached(ctx, caseKey(0)); got != nil || !errors.Is(err, shmcache.ErrNotFound) {
		t.Errorf("GetMetaCached on a destroyed cache: %v, %v", got, err)
	}
	// Teranode's shape has no error: the whole cache's counts are 0, this handle's stay
	if st := c.GetCacheStats(); st.EntriesCount != 0 || st.TotalElementsAdded != 0 || st.Hits == 0 {
		t.Errorf("GetCacheStats of a destroyed cache: %+v", st)
	}
}

// TestCloseOfAFailedAttachIsNothing: the package example's `defer c.Close()` after a failed
// Attach (a nil *Cache) returns nil instead of panicking, as the reader's Close does.
func TestCloseOfAFailedAttachIsNothing(t *testing.T) {
	c, err := Attach("t-txmeta-no-such-cache-" + t.Name())
	if err == nil || c != nil {
		t.Fatalf("Attach of no cache: %v, %v", c, err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close of a nil *Cache: %v", err)
	}
}

// Health with SetReadyLimits: a cache that is ready, but 40 messages behind on partition
// 1 (golden/control's control_ready_behind), is 200 without limits and within MaxLag(40),
// and 503 naming the partition past MaxLag(39); WaitReady takes the same limits.
func TestHealthWithReadyLimits(t *testing.T) {
	cases, err := goldencache.ControlCases("../../golden/control")
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]int64{}
	for _, role := range []string{"supervisor", "worker"} {
		p := exec.Command("sleep", "600")
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Process.Kill(); p.Wait() }) // by pid: only the processes this test started
		owners[role] = shmcache.OwnerWord(p.Process.Pid)
	}
	name := fmt.Sprintf("txmeta-go-limits-%d", os.Getpid())
	remove, err := cases["control_ready_behind"].Install("../../golden/control", name, owners)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remove)
	c, err := Attach(name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		limit []shmcache.Limit
		code  int
		says  string
	}{
		{nil, http.StatusOK, "ready"},
		{[]shmcache.Limit{shmcache.MaxLag(40)}, http.StatusOK, "ready"},
		{[]shmcache.Limit{shmcache.MaxLag(39)}, http.StatusServiceUnavailable,
			"': ready, but behind: partitions more than 39 messages behind: 1 (lag 40)"},
		{[]shmcache.Limit{shmcache.MaxBehind(10 * time.Minute)}, http.StatusServiceUnavailable,
			"partitions more than 600.0 s behind: 2 (unknown)"},
		{nil, http.StatusOK, "ready"}, // the limits set again: none
	} {
		c.SetReadyLimits(tc.limit...)
		code, msg, err := c.Health(ctx, false)
		if code != tc.code || err != nil || !strings.HasSuffix(msg, tc.says) {
			t.Errorf("limits %d: %d %q %v; want %d ending %q", len(tc.limit), code, msg, err, tc.code, tc.says)
		}
		if code, _, _ := c.Health(ctx, true); code != http.StatusOK {
			t.Errorf("liveness with limits %d: %d", len(tc.limit), code)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := c.WaitReady(wctx, shmcache.MaxLag(2)); !errors.Is(err, shmcache.ErrNotReady) ||
		!strings.Contains(err.Error(), "partitions more than 2 messages behind: 1 (lag 40), 2 (lag 3)") {
		t.Errorf("WaitReady past MaxLag(2): %v", err)
	}
}
