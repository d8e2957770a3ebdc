package metrics

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/shmcache/shmcache/go/internal/testpython"
	"github.com/shmcache/shmcache/go/txmeta"
)

// writer is a Python process that made cache name and answers lines (its first one is
// "ready"); it is stopped by pid, and the cache's files removed, when the test ends.
type writer struct {
	stdin io.WriteCloser
	lines *bufio.Scanner
	cmd   *exec.Cmd
}

func start(t *testing.T, name string, argv ...string) *writer {
	cmd := exec.Command(testpython.Path(t), argv...)
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &writer{stdin: stdin, lines: bufio.NewScanner(out), cmd: cmd}
	w.lines.Buffer(nil, 1<<20)
	t.Cleanup(func() {
		w.stop()
		os.Remove("/dev/shm/" + name)
		os.Remove("/dev/shm/.shmcache-" + name + ".readers")
	})
	if !w.lines.Scan() || w.lines.Text() != "ready" {
		t.Fatalf("%v did not make cache %s: %q", argv, name, w.lines.Text())
	}
	return w
}

// stop ends the writer's input (it destroys its cache) and waits for it.
func (w *writer) stop() {
	if w.stdin != nil {
		w.stdin.Close()
		w.stdin = nil
		w.cmd.Wait()
	}
}

func cacheName(t *testing.T) string {
	return fmt.Sprintf("t-metrics-%d-%s", os.Getpid(), t.Name())
}

// gather is every metric the collector sends now, by name and then by its labels' values.
func gather(t *testing.T, c *txmeta.Cache) map[string]map[string]float64 {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(New(c))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]float64{}
	for _, f := range families {
		if f.GetType() != dto.MetricType_GAUGE {
			t.Errorf("%s is a %v: Teranode's and the supervisor's are gauges", f.GetName(), f.GetType())
		}
		got[f.GetName()] = map[string]float64{}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetValue())
			}
			got[f.GetName()][strings.Join(labels, ",")] = m.GetGauge().GetValue()
		}
	}
	return got
}

// Teranode's gauges are the cache's CacheStats, field by field, after lookups that hit, miss
// and find a malformed value; once the cache is destroyed, shmcache_up is 0, the cache's
// counts 0, this handle's kept, and nothing of the supervisor's is sent.
func TestTeranodeGaugesAreTheCacheStats(t *testing.T) {
	name := cacheName(t)
	w := start(t, name, "../txmeta/testdata/fill.py", name, "../../golden/txmeta/cases.json", "4096")
	c, err := txmeta.Attach(name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hashes := make([][32]byte, 0, 1100)
	for i := range 1000 {
		hashes = append(hashes, sha256.Sum256([]byte(fmt.Sprintf("txmeta go test %d", i))))
	}
	for i := range 100 {
		hashes = append(hashes, sha256.Sum256([]byte(fmt.Sprintf("absent %d", i))))
	}
	var b txmeta.Batch
	if err := txmeta.GetMetaCachedBatch(context.Background(), c, hashes, &b); err != nil {
		t.Fatal(err)
	}
	if b.Hits == 0 || b.Misses < 100 || b.Malformed == 0 {
		t.Fatalf("the lookups should hit, miss and find malformed values: %d, %d, %d", b.Hits, b.Misses, b.Malformed)
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	got := gather(t, c)
	want := map[string]uint64{"size": st.EntriesCount, "insertions": st.Insertions, "hits": st.Hits,
		"misses": st.Misses, "evictions": st.Evictions, "trims": st.TrimCount, "map_size": st.TotalMapSize,
		"total_elements_added": st.TotalElementsAdded}
	for k, v := range want {
		if g := got["teranode_tx_meta_cache_"+k][""]; g != float64(v) {
			t.Errorf("teranode_tx_meta_cache_%s = %v, want %d", k, g, v)
		}
	}
	if st.EntriesCount == 0 || st.Hits != uint64(b.Hits) {
		t.Fatalf("stats %+v after %d hits", st, b.Hits)
	}
	if got["shmcache_up"][""] != 1 || got["shmcache_reader_malformed_values"][""] != float64(b.Malformed) ||
		got["shmcache_ready"][""] != 0 || got["shmcache_deletes"][""] != float64(st.Deletes) {
		t.Errorf("shmcache_up, _reader_malformed_values, _ready, _deletes: %v %v %v %v", got["shmcache_up"],
			got["shmcache_reader_malformed_values"], got["shmcache_ready"], got["shmcache_deletes"])
	}
	if _, ok := got["teranode_tx_meta_cache_hit_old_tx"]; ok {
		t.Error("hit_old_tx is exported: there is no horizon")
	}

	w.stop() // the cache destroyed: the handle follows the name and finds none
	gone := gather(t, c)
	if gone["shmcache_up"][""] != 0 || gone["teranode_tx_meta_cache_size"][""] != 0 ||
		gone["teranode_tx_meta_cache_hits"][""] != float64(b.Hits) {
		t.Errorf("a destroyed cache: up %v, size %v, hits %v", gone["shmcache_up"], gone["teranode_tx_meta_cache_size"],
			gone["teranode_tx_meta_cache_hits"])
	}
	if _, ok := gone["shmcache_ready"]; ok {
		t.Error("a destroyed cache sends the supervisor's figures")
	}
}

// The supervisor's figures are the Python reader's status of the same control area
// (shmtest.control_writer's "lagging" scenario: 25 partitions, six workers in every state,
// one partition whose lag is unknown): each partition's lag, caught-up flag and applied
// offset, the workers' summed counts and how many are up.
func TestSupervisorFiguresAreThePythonStatus(t *testing.T) {
	name := cacheName(t)
	testpython.WithHelpers(t)
	w := start(t, name, "-P", "-m", "shmtest.control_writer", name)
	fmt.Fprintln(w.stdin, "scenario lagging")
	if !w.lines.Scan() {
		t.Fatal("shmtest.control_writer did not answer")
	}
	var py struct {
		Ready    bool `json:"ready"`
		Assigned []struct {
			Partition int      `json:"partition"`
			Applied   int64    `json:"applied"`
			Lag       *int64   `json:"lag"`
			BehindS   *float64 `json:"behind_s"`
			CaughtUp  bool     `json:"caught_up"`
		} `json:"assigned"`
		Workers []struct {
			State          string `json:"state"`
			Stale          bool   `json:"stale"`
			Messages       int64  `json:"messages"`
			Malformed      int64  `json:"malformed"`
			UnknownActions int64  `json:"unknown_actions"`
		} `json:"workers"`
	}
	if err := json.Unmarshal(w.lines.Bytes(), &py); err != nil {
		t.Fatal(err)
	}
	c, err := txmeta.Attach(name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := gather(t, c)
	if got["shmcache_ready"][""] != 0 || py.Ready {
		t.Errorf("ready: %v, Python's %v", got["shmcache_ready"], py.Ready)
	}
	unknownLag, unknownBehind := 0, 0
	for _, p := range py.Assigned {
		part := fmt.Sprint(p.Partition)
		lag, ok := got["shmcache_partition_lag_messages"][part]
		switch {
		case p.Lag == nil && ok:
			t.Errorf("partition %s: lag %v sent, unknown to Python", part, lag)
		case p.Lag == nil:
			unknownLag++
		case !ok || lag != float64(*p.Lag):
			t.Errorf("partition %s: lag %v, Python's %d", part, lag, *p.Lag)
		}
		behind, ok := got["shmcache_partition_behind_seconds"][part]
		switch {
		case p.BehindS == nil && ok:
			t.Errorf("partition %s: behind %v sent, unknown to Python", part, behind)
		case p.BehindS == nil:
			unknownBehind++
		case !ok || math.Abs(behind-*p.BehindS) > 5: // read a moment apart
			t.Errorf("partition %s: behind %v s, Python's %v", part, behind, *p.BehindS)
		}
		if got["shmcache_partition_caught_up"][part] != b2f(p.CaughtUp) ||
			got["shmcache_partition_applied_offset"][part] != float64(p.Applied) {
			t.Errorf("partition %s: caught up %v, applied %v; Python's %+v", part,
				got["shmcache_partition_caught_up"][part], got["shmcache_partition_applied_offset"][part], p)
		}
	}
	if unknownBehind == 0 || unknownBehind == 25 {
		t.Errorf("%d of 25 partitions of unknown behind_s: the scenario has both", unknownBehind)
	}
	if len(py.Assigned) != 25 || unknownLag != 1 || len(got["shmcache_partition_applied_offset"]) != 25 {
		t.Errorf("%d partitions, %d of unknown lag, %d sent", len(py.Assigned), unknownLag,
			len(got["shmcache_partition_applied_offset"]))
	}
	var messages, malformed, unknown, up float64
	for _, w := range py.Workers {
		messages += float64(w.Messages)
		malformed += float64(w.Malformed)
		unknown += float64(w.UnknownActions)
		if w.State == "up" && !w.Stale {
			up++
		}
	}
	if g := [4]float64{got["shmcache_applied_messages"][""], got["shmcache_malformed_messages"][""],
		got["shmcache_unknown_action_entries"][""], got["shmcache_workers_up"][""]}; g != [4]float64{
		messages, malformed, unknown, up} || malformed == 0 || up == 0 || up == float64(len(py.Workers)) {
		t.Errorf("workers' messages, malformed, unknown, up: %v; Python's %v", g,
			[4]float64{messages, malformed, unknown, up})
	}
}
