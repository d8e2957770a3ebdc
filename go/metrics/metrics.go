// Package metrics exports a go/txmeta cache's figures as Prometheus metrics, under
// Teranode's names where its txmetacache has them. It is a module of its own, so that a
// service that wants no Prometheus client keeps the reader's module at xxhash and x/sys.
//
//	c, err := txmeta.Attach("txmeta")
//	...
//	prometheus.MustRegister(metrics.New(c))
//
// Every figure is read from the shared segment when Prometheus scrapes (no goroutine, no
// ticker): the cache's counts under Teranode's gauges teranode_tx_meta_cache_NAME (size,
// insertions, hits, misses, evictions, trims, map_size, total_elements_added, as
// txmetacache's CacheStats and its metrics goroutine set them at the commit
// docs/teranode.md names), and the supervisor's view of it under the names of its own
// /metrics endpoint (shmcache_ready, shmcache_partition_lag_messages, ...). Teranode's
// get_origin (reads that went to the store) is the service's own to count, and hit_old_tx
// has no counterpart (no horizon): neither is exported.
package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	shmcache "github.com/shmcache/shmcache/go"
	"github.com/shmcache/shmcache/go/txmeta"
)

// teranode names the gauges Teranode's txmetacache exports, and how each is read here.
var teranode = []struct {
	name, help string
	value      func(*txmeta.CacheStats) uint64
}{
	{"size", "Number of items in the tx meta cache", func(s *txmeta.CacheStats) uint64 { return s.EntriesCount }},
	{"insertions", "Number of insertions into the tx meta cache", func(s *txmeta.CacheStats) uint64 { return s.Insertions }},
	{"hits", "Number of hits in the tx meta cache", func(s *txmeta.CacheStats) uint64 { return s.Hits }},
	{"misses", "Number of misses in the tx meta cache", func(s *txmeta.CacheStats) uint64 { return s.Misses }},
	{"evictions", "Number of evictions in the tx meta cache", func(s *txmeta.CacheStats) uint64 { return s.Evictions }},
	{"trims", "Number of trim operations in the tx meta cache", func(s *txmeta.CacheStats) uint64 { return s.TrimCount }},
	{"map_size", "Number of total elements in the improved cache's bucket maps",
		func(s *txmeta.CacheStats) uint64 { return s.TotalMapSize }},
	{"total_elements_added", "Number of total number of elements added to the txmetacache",
		func(s *txmeta.CacheStats) uint64 { return s.TotalElementsAdded }},
}

// Collector is a prometheus.Collector over one txmeta cache.
type Collector struct {
	c        *txmeta.Cache
	teranode []*prometheus.Desc

	up, ready, malformedValues, deletes                       *prometheus.Desc
	lag, behind, caughtUp, applied                            *prometheus.Desc
	appliedMessages, malformedMessages, unknownActions, alive *prometheus.Desc
}

// New is a Collector of c's figures; register it once (prometheus.MustRegister).
func New(c *txmeta.Cache) *Collector {
	x := &Collector{c: c}
	for _, t := range teranode {
		x.teranode = append(x.teranode, prometheus.NewDesc("teranode_tx_meta_cache_"+t.name, t.help, nil, nil))
	}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("shmcache_"+name, help, labels, nil)
	}
	x.up = d("up", "1 while the cache can be read (not destroyed, cut short or closed).")
	x.ready = d("ready", "1 when every partition of the topic is assigned to this cache by a live supervisor "+
		"that reaches the broker, and caught up, with no retention gap (or gaps accepted).")
	x.malformedValues = d("reader_malformed_values", "Values this handle found that are not txmeta.")
	x.deletes = d("deletes", "DELETEs the supervisor's workers applied since the cache was created.")
	x.lag = d("partition_lag_messages", "High watermark of the partition's last fetch minus the applied offset.",
		"partition")
	x.behind = d("partition_behind_seconds", "Seconds since the last message the partition applied was produced, "+
		"while it lags (0 without lag); absent when not known.", "partition")
	x.caughtUp = d("partition_caught_up", "1 once the partition applied up to its readiness target.", "partition")
	x.applied = d("partition_applied_offset", "Next offset to apply: every message before it is in the table.",
		"partition")
	x.appliedMessages = d("applied_messages", "Kafka messages applied by the supervisor's workers.")
	x.malformedMessages = d("malformed_messages", "Messages with damage (the entries before it were applied).")
	x.unknownActions = d("unknown_action_entries", "Entries skipped for an unknown action.")
	x.alive = d("workers_up", "The supervisor's workers that are up and beating.")
	return x
}

// Describe sends every metric's description.
func (x *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range x.teranode {
		ch <- d
	}
	for _, d := range []*prometheus.Desc{x.up, x.ready, x.malformedValues, x.deletes, x.lag, x.behind, x.caughtUp, x.applied,
		x.appliedMessages, x.malformedMessages, x.unknownActions, x.alive} {
		ch <- d
	}
}

// Collect reads the cache now. A cache that cannot be read sends shmcache_up 0, this
// handle's own counts, and nothing of the supervisor's.
func (x *Collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	stats, err := x.c.Stats()
	if err != nil {
		stats = x.c.GetCacheStats() // this handle's counts, the cache's 0
	}
	for i, t := range teranode {
		gauge(x.teranode[i], float64(t.value(stats)))
	}
	gauge(x.malformedValues, float64(stats.Malformed))
	var st shmcache.Status
	if err == nil {
		st, err = x.c.Reader().Status()
	}
	if err != nil {
		gauge(x.up, 0)
		return
	}
	gauge(x.up, 1)
	gauge(x.deletes, float64(stats.Deletes))
	gauge(x.ready, b2f(st.Ready))
	for _, p := range st.Assigned {
		part := strconv.Itoa(p.Partition)
		if p.Lag != nil {
			gauge(x.lag, float64(*p.Lag), part)
		}
		if p.BehindS != nil {
			gauge(x.behind, *p.BehindS, part)
		}
		gauge(x.caughtUp, b2f(p.CaughtUp), part)
		gauge(x.applied, float64(p.Applied), part)
	}
	var messages, malformed, unknown, up int64
	for _, w := range st.Workers {
		messages += w.Messages
		malformed += w.Malformed
		unknown += w.UnknownActions
		if w.State == "up" && !w.Stale {
			up++
		}
	}
	gauge(x.appliedMessages, float64(messages))
	gauge(x.malformedMessages, float64(malformed))
	gauge(x.unknownActions, float64(unknown))
	gauge(x.alive, float64(up))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
