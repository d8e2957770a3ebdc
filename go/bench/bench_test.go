package bench

// Speed (issue 41, part 5; issue 46, section 6): GetMany on SHMCACHE_BENCH_N (default
// 1,000,000) Teranode-shaped entries in batches of 1024, hits and misses, beside the Python
// reader's get_many_packed and VictoriaMetrics/fastcache's in-process Get on the same
// entries:
//
//	cd go/bench && go test -run '^$' -bench . -benchmem -cpu 1
//
// keys/s is per core (one goroutine). The cache is filled by testdata/bench.py. Each
// benchmark runs alone here, one after another; readerspeed/compare.py takes the Go and
// Python readers' rounds in turn, the figure to quote on a shared host. The figures and
// what bounds them are in bench/README.md ("The Go reader").

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/fastcache"
	shmcache "github.com/shmcache/shmcache/go"
)

const benchBatch = 1024

type benchData struct {
	name          string
	keys, misses  []byte
	offsets       []int64
	values        []byte
	py            *exec.Cmd
	pyIn          *os.File
	pyOut         *bufio.Scanner
	dir           string
	err           error
	fastcache     *fastcache.Cache
	fastcacheOnce sync.Once
}

var (
	bench     benchData
	benchOnce sync.Once
)

func TestMain(m *testing.M) {
	code := m.Run()
	if bench.py != nil {
		bench.pyIn.Close()
		bench.py.Wait() // it destroys the cache at end of input
		os.Remove("/dev/shm/" + bench.name)
		os.Remove("/dev/shm/.shmcache-" + bench.name + ".readers")
	}
	if bench.dir != "" {
		os.RemoveAll(bench.dir)
	}
	os.Exit(code)
}

// python is the repository's virtualenv interpreter (scripts/setup makes it), or
// SHMCACHE_PYTHON; "" if there is none.
func python() string {
	p, _ := filepath.Abs("../../.venv/bin/python")
	if env := os.Getenv("SHMCACHE_PYTHON"); env != "" {
		p = env
	}
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

func benchN() int {
	if n, err := strconv.Atoi(os.Getenv("SHMCACHE_BENCH_N")); err == nil && n >= benchBatch {
		return n
	}
	return 1_000_000
}

func setupBench(b *testing.B) *benchData {
	py := python()
	if py == "" {
		b.Skip("no Python with shmcache to fill the cache (run scripts/setup, or set SHMCACHE_PYTHON)")
	}
	benchOnce.Do(func() {
		d := &bench
		n := benchN()
		d.name = fmt.Sprintf("go-bench-%d", os.Getpid())
		d.dir, d.err = os.MkdirTemp("", "shmcache-go-bench")
		if d.err != nil {
			return
		}
		d.py = exec.Command(py, "testdata/bench.py", d.name, strconv.Itoa(n), d.dir)
		r, w, _ := os.Pipe()
		d.py.Stdin, d.pyIn = r, w
		out, _ := d.py.StdoutPipe()
		d.py.Stderr = os.Stderr
		if d.err = d.py.Start(); d.err != nil {
			return
		}
		r.Close()
		d.pyOut = bufio.NewScanner(out)
		if !d.pyOut.Scan() || d.pyOut.Text() != "ready" {
			d.err = fmt.Errorf("testdata/bench.py did not fill the cache: %q", d.pyOut.Text())
			return
		}
		read := func(f string) []byte {
			raw, err := os.ReadFile(filepath.Join(d.dir, f))
			if err != nil {
				d.err = err
			}
			return raw
		}
		d.keys, d.misses, d.values = read("keys.bin"), read("misses.bin"), read("values.bin")
		raw := read("offsets.bin")
		d.offsets = make([]int64, len(raw)/8)
		for i := range d.offsets {
			d.offsets[i] = int64(binary.LittleEndian.Uint64(raw[i*8:]))
		}
	})
	if bench.err != nil {
		b.Fatal(bench.err)
	}
	return &bench
}

func benchGetMany(b *testing.B, hits bool) {
	d := setupBench(b)
	c, err := shmcache.Attach(d.name)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	src := d.keys
	if !hits {
		src = d.misses
	}
	var out shmcache.Batch
	n := len(src) / 32
	if err := c.GetMany(src[:benchBatch*32], &out); err != nil { // steady state: the batch's buffers grown
		b.Fatal(err)
	}
	pos := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if pos+benchBatch > n {
			pos = 0
		}
		if err := c.GetMany(src[pos*32:(pos+benchBatch)*32], &out); err != nil {
			b.Fatal(err)
		}
		if got := out.Hits(); (got == benchBatch) != hits {
			b.Fatalf("%d hits of %d", got, benchBatch)
		}
		pos += benchBatch
	}
	b.ReportMetric(float64(b.N)*benchBatch/b.Elapsed().Seconds(), "keys/s")
}

func BenchmarkGetManyHits(b *testing.B)   { benchGetMany(b, true) }
func BenchmarkGetManyMisses(b *testing.B) { benchGetMany(b, false) }

// The Python reader's get_many_packed on the same cache and keys, timed in its process.
func benchPython(b *testing.B, what string) {
	d := setupBench(b)
	fmt.Fprintf(d.pyIn, "%s %d\n", what, b.N)
	if !d.pyOut.Scan() {
		b.Fatal("testdata/bench.py did not answer")
	}
	ns, _ := strconv.ParseInt(strings.TrimSpace(d.pyOut.Text()), 10, 64)
	b.ReportMetric(float64(b.N)*benchBatch/(float64(ns)/1e9), "keys/s")
	b.ReportMetric(float64(ns)/float64(b.N), "py-ns/op")
}

func BenchmarkPythonGetManyPackedHits(b *testing.B)   { benchPython(b, "hits") }
func BenchmarkPythonGetManyPackedMisses(b *testing.B) { benchPython(b, "misses") }

// VictoriaMetrics/fastcache (what Teranode's txmetacache forks), in-process, the same
// entries, Get of each key of a batch into one reused buffer.
func benchFastcache(b *testing.B, hits bool) {
	d := setupBench(b)
	n := len(d.keys) / 32
	d.fastcacheOnce.Do(func() {
		d.fastcache = fastcache.New(int(d.offsets[n]) * 4)
		for i := 0; i < n; i++ {
			d.fastcache.Set(d.keys[i*32:(i+1)*32], d.values[d.offsets[i]:d.offsets[i+1]])
		}
	})
	src := d.keys
	if !hits {
		src = d.misses
	}
	dst := make([]byte, 0, benchBatch*160)
	pos := 0
	b.ReportAllocs()
	b.ResetTimer()
	t0 := time.Now()
	for i := 0; i < b.N; i++ {
		if pos+benchBatch > n {
			pos = 0
		}
		dst = dst[:0]
		for k := pos; k < pos+benchBatch; k++ {
			dst = d.fastcache.Get(dst, src[k*32:(k+1)*32])
		}
		pos += benchBatch
	}
	b.ReportMetric(float64(b.N)*benchBatch/time.Since(t0).Seconds(), "keys/s")
}

func BenchmarkFastcacheGetHits(b *testing.B)   { benchFastcache(b, true) }
func BenchmarkFastcacheGetMisses(b *testing.B) { benchFastcache(b, false) }
