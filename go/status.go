package shmcache

// Readiness (docs/segment-format.md, section 14): how the cache is being kept filled,
// from the control area's words alone, by the rule of the Python reader's wait_ready.

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// PartitionStatus is one partition assigned to this cache.
type PartitionStatus struct {
	Partition     int    `json:"partition"`
	Worker        int    `json:"worker"` // -1 none
	Applied       int64  `json:"applied"`
	HighWatermark int64  `json:"high_watermark"`
	CaughtUp      bool   `json:"caught_up"`   // its flag, and its worker up and beating
	WorkerDown    string `json:"worker_down"` // why its worker applies nothing now ("" up and beating)
	Gap           bool   `json:"gap"`
}

// Status says whether the cache is ready: every partition of its topic assigned here by
// the supervisor alive now and applied up to its target.
type Status struct {
	Name            string            `json:"name"`
	Topic           string            `json:"topic"`
	Partitions      int               `json:"partitions"`
	SupervisorPID   int               `json:"supervisor_pid"`
	SupervisorAlive bool              `json:"supervisor_alive"`
	SupervisorStale bool              `json:"supervisor_stale"`
	Assigned        []PartitionStatus `json:"assigned"`
	Unassigned      []int             `json:"unassigned"`
	BrokerWaiting   bool              `json:"broker_waiting"`
	Assigning       bool              `json:"assigning"`
	GapsAccepted    bool              `json:"gaps_accepted"`
	CaughtUp        bool              `json:"caught_up"`
	Ready           bool              `json:"ready"`
	Why             string            `json:"why"` // why it is not ready ("" when it is)
}

type workerState struct {
	down string // "" up and beating
}

// Status reads the control area now.
func (c *Cache) Status() (st Status, err error) {
	s, err := c.acquire()
	if err != nil {
		return st, err
	}
	defer c.mu.RUnlock()
	if err = protect(func() error { st = status(s, c.name); return nil }); err != nil {
		s.lost.Store(true)
		return Status{}, lostErr(c.name, c.path)
	}
	return st, nil
}

func status(s *segment, name string) Status {
	h := func(i int) int64 { return atomic.LoadInt64(&s.header[i]) }
	st := Status{Name: name, Unassigned: []int{}, Assigned: []PartitionStatus{}}
	rebalances, assigning := h(hRebalances), h(hAssigning)
	n := h(hPartitions)
	if n < 0 || n > maxPartitions {
		n = 0
	}
	st.Partitions = int(n)
	if tl := h(hTopicLen); tl >= 0 && tl <= topicMax {
		raw := make([]byte, tl)
		for i := range raw {
			raw[i] = byte(s.header[hTopic+i/word] >> (8 * (i % word)))
		}
		st.Topic = string(raw)
	}
	sup := h(hSupervisor)
	st.SupervisorAlive = sup != 0 && IsAlive(sup)
	if sup > 0 {
		st.SupervisorPID = int(sup >> 32)
	}
	now := wallNS()
	if h(hAgeClock) == ageClockMonotonic {
		now = monotonicNS()
	}
	workers := workerStates(s, st.SupervisorAlive, now)
	for p := 0; p < int(n); p++ {
		r := s.partitions[p*rowWords : (p+1)*rowWords]
		if atomic.LoadInt64(&r[pAssigned]) == 0 {
			st.Unassigned = append(st.Unassigned, p)
			continue
		}
		owner := int(atomic.LoadInt64(&r[pOwner])) - 1
		if owner < -1 || owner >= maxWorkers {
			owner = -1
		}
		ps := PartitionStatus{Partition: p, Worker: owner, Applied: atomic.LoadInt64(&r[pApplied]),
			HighWatermark: atomic.LoadInt64(&r[pHighWater]), Gap: h(hGapBits+p/64)>>(p%64)&1 != 0}
		ps.WorkerDown = "not running"
		if w, ok := workers[owner]; ok && owner >= 0 {
			ps.WorkerDown = w.down
		}
		ps.CaughtUp = atomic.LoadInt64(&r[pCaughtUp]) != 0 && ps.WorkerDown == ""
		st.Assigned = append(st.Assigned, ps)
	}
	settled := assigning == 0 && h(hAssigning) == 0 && h(hRebalances) == rebalances
	st.Assigning = !settled
	if st.SupervisorAlive {
		if beat := h(hSupervisorHeartbeat); beat > 0 && now-beat > staleHeartbeatNS {
			st.SupervisorStale = true
		}
		st.BrokerWaiting = h(hBrokerState) == brokerWaiting
		st.GapsAccepted = h(hAcceptGaps) != 0
	}
	all := true
	gaps := false
	for _, p := range st.Assigned {
		all = all && p.CaughtUp
		gaps = gaps || p.Gap
	}
	st.CaughtUp = settled && st.SupervisorAlive && !st.SupervisorStale && n > 0 && len(st.Assigned) == int(n) &&
		!st.BrokerWaiting && all
	st.Ready = st.CaughtUp && (!gaps || st.GapsAccepted)
	st.Why = why(st, gaps)
	return st
}

// workerStates: each worker row in use, by index, and why it applies nothing now.
func workerStates(s *segment, supAlive bool, now int64) map[int]workerState {
	bound := int64(0)
	if supAlive {
		bound = atomic.LoadInt64(&s.header[hWorkerStaleNS])
	}
	waits := map[int64]bool{} // owner words of writers waiting for a live process's lock
	for w := 0; w < maxWriters; w++ {
		o, wait := atomic.LoadInt64(&s.writers[w*rowWords+wOwner]), atomic.LoadInt64(&s.writers[w*rowWords+wWait])
		if o != 0 && wait > 0 && wait <= NBuckets {
			waits[o] = true
		}
	}
	out := map[int]workerState{}
	for i := 0; i < maxWorkers; i++ {
		r := s.workers[i*rowWords : (i+1)*rowWords]
		owner, beat := atomic.LoadInt64(&r[kOwner]), atomic.LoadInt64(&r[kHeartbeat])
		if owner == 0 && atomic.LoadInt64(&r[kStarts]) == 0 {
			continue
		}
		handle := int64(0)
		if supAlive {
			handle = atomic.LoadInt64(&s.header[hWorkerHandles+i]) & 0xFF
		}
		switch {
		case owner == 0 || !IsAlive(owner):
			out[i] = workerState{down: "stopped"}
		case handle == workerStateStopIx:
			out[i] = workerState{down: "stopping"}
		case handle == workerStateBackIx:
			out[i] = workerState{down: "backing-off"}
		case bound > 0 && beat > 0 && now-beat > bound:
			out[i] = workerState{down: fmt.Sprintf("stale, no heartbeat for %.0f s", float64(now-beat)/1e9)}
		case waits[owner]:
			out[i] = workerState{down: "waiting for a bucket's lock, held by another live process"}
		default:
			out[i] = workerState{}
		}
	}
	return out
}

func why(st Status, gaps bool) string {
	switch {
	case st.Ready:
		return ""
	case !st.SupervisorAlive:
		return "no live supervisor"
	case st.SupervisorStale:
		return fmt.Sprintf("the supervisor (pid %d) has not gone round its loop for over 10 s: stopped or hung", st.SupervisorPID)
	case st.BrokerWaiting:
		return "waiting for the Kafka broker"
	case len(st.Assigned) == 0:
		return "no partitions assigned yet"
	case st.Assigning:
		return "an assignment is being published"
	case len(st.Unassigned) > 0:
		return fmt.Sprintf("%d of %d partitions not assigned to this cache", len(st.Unassigned), st.Partitions)
	}
	var lag []string
	for _, p := range st.Assigned {
		if !p.CaughtUp && len(lag) < 20 {
			lag = append(lag, fmt.Sprintf("%d (applied %d of %d%s)", p.Partition, p.Applied, p.HighWatermark,
				map[bool]string{true: ", worker " + p.WorkerDown, false: ""}[p.WorkerDown != ""]))
		}
	}
	if len(lag) == 0 && gaps {
		return "retention gap: the topic deleted offsets before this cache had them (the supervisor's --accept-gaps serves it as it is)"
	}
	return "partitions not caught up: " + strings.Join(lag, ", ")
}

// WaitReady polls Status every 0.05 s until the cache is ready or ctx is done; then an
// error of kind ErrNotReady saying why it is not.
func (c *Cache) WaitReady(ctx context.Context) (Status, error) {
	tick := time.NewTicker(waitReadyPollNS)
	defer tick.Stop()
	for {
		st, err := c.Status()
		if err != nil || st.Ready {
			return st, err
		}
		select {
		case <-ctx.Done():
			return st, newErr(c.name, ErrNotReady, "not ready (%v): %s", ctx.Err(), st.Why)
		case <-tick.C:
		}
	}
}
