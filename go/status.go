package shmcache

// Readiness (docs/segment-format.md, section 14): how the cache is being kept filled,
// from the control area's words alone, by the rule every reader follows, with the same
// fields, reason and why as the Python reader's status() (docs/reader-contract.md). The
// control area is untrusted: a word out of its range reads as nothing, never as an error.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// PartitionStatus is one partition assigned to this cache.
type PartitionStatus struct {
	Partition     int      `json:"partition"`
	Worker        *int     `json:"worker"` // its worker's index, nil none
	Applied       int64    `json:"applied"`
	HighWatermark int64    `json:"high_watermark"` // the readiness target (-1 unknown)
	Latest        int64    `json:"latest"`         // the newest high watermark seen, never below applied
	Lag           *int64   `json:"lag"`            // latest - applied, nil unknown
	BehindS       *float64 `json:"behind_s"`       // seconds since the last message applied was produced, 0 without lag; nil unknown
	CaughtUp      bool     `json:"caught_up"`      // its flag, and its worker up and beating
	WorkerDown    *string  `json:"worker_down"`    // why its worker applies nothing now; nil: up and beating
	Gap           bool     `json:"gap"`            // retention deleted offsets this table never had
}

// GroupMember is another member of the cache's consumer group, as the supervisor last saw it.
type GroupMember struct {
	ClientID   string `json:"client_id"`
	Host       string `json:"host"`
	InstanceID string `json:"instance_id"`
	Partitions []int  `json:"partitions"` // partitions of the topic it holds
}

// Status says whether the cache is ready (every partition of its topic assigned here by
// the supervisor alive now and applied up to its target) and, when not, why, by the rule
// of [format section 14]. Its JSON is [the readers' contract]'s; a nil pointer is JSON's
// null.
//
// [format section 14]: https://github.com/shmcache/shmcache/blob/main/docs/segment-format.md#14-readiness-the-control-area
// [the readers' contract]: https://github.com/shmcache/shmcache/blob/main/docs/reader-contract.md#status-and-wait-ready
type Status struct {
	Name                    string            `json:"name"`
	Topic                   string            `json:"topic"`
	Partitions              int               `json:"partitions"`
	SupervisorPID           *int64            `json:"supervisor_pid"` // nil: none
	SupervisorAlive         bool              `json:"supervisor_alive"`
	SupervisorStale         bool              `json:"supervisor_stale"` // alive, its loop not gone round for 10 s
	SupervisorHeartbeatAgeS *float64          `json:"supervisor_heartbeat_age_s"`
	Broker                  *string           `json:"broker"` // connecting, up, waiting for the broker; nil: no live supervisor
	BrokerWaitingS          *float64          `json:"broker_waiting_s"`
	LookupError             string            `json:"lookup_error"` // a failing look-up of where partitions start
	LookupFailingS          *float64          `json:"lookup_failing_s"`
	Assigning               bool              `json:"assigning"` // an assignment is being published
	Assigned                []PartitionStatus `json:"assigned"`
	Unassigned              []int             `json:"unassigned"`
	Elsewhere               []int             `json:"elsewhere"` // unassigned, held by another member of the group
	SharedGroup             bool              `json:"shared_group"`
	GroupMembers            *int64            `json:"group_members"`
	GroupOthers             []GroupMember     `json:"group_others"`
	GapPartitions           []int             `json:"gap_partitions"`
	GapOffsets              int64             `json:"gap_offsets"`
	GapsAccepted            bool              `json:"gaps_accepted"`
	CaughtUp                bool              `json:"caught_up"`
	Ready                   bool              `json:"ready"`
	Reason                  string            `json:"reason"` // "ready", or a word of the table in section 14
	Why                     string            `json:"why"`    // "" when ready, else that table's sentence
	Workers                 []WorkerStatus    `json:"workers"`
}

// WorkerStatus is a worker row in use (the spec's section 14, "The workers"): the
// supervisor's worker process, its state, and what it applied since its slot was first
// started: entries by action, Kafka messages, malformed messages (their valid prefix
// applied) and entries of an unknown action (skipped). The same figures as the
// supervisor's `shmcache status`.
type WorkerStatus struct {
	Worker           int      `json:"worker"`
	PID              *int64   `json:"pid"` // nil: the row has no owner yet
	Alive            bool     `json:"alive"`
	State            string   `json:"state"`            // a WORKER_STATES word
	RestartFailures  int64    `json:"restart_failures"` // its deaths in a row (the supervisor's backoff)
	NextRestartS     *float64 `json:"next_restart_s"`   // backing off: when its restart is due, unix seconds
	HeartbeatAgeS    *float64 `json:"heartbeat_age_s"`  // nil: no heartbeat yet
	Stale            bool     `json:"stale"`            // up, its heartbeat older than the supervisor's bound
	WaitingForBucket *int64   `json:"waiting_for_bucket"`
	Starts           int64    `json:"starts"`
	Adds             int64    `json:"adds"`
	Deletes          int64    `json:"deletes"`
	Messages         int64    `json:"messages"`
	Malformed        int64    `json:"malformed"`
	UnknownActions   int64    `json:"unknown_actions"`
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

// A Limit bounds how far behind its topic a ready cache may be, partition by partition
// (format section 14, "The readiness bound"): MaxLag in messages, MaxBehind in time.
// Readiness alone is a latch, right for "the cache holds the whole topic"; a limit also
// asks "and is no more than this behind it".
type Limit func(*limits)

type limits struct {
	lag, behind bool
	maxLag      int64
	maxBehindS  float64
}

// MaxLag: no partition more than n messages behind its topic's newest offset (a lag not
// known is more).
func MaxLag(n int64) Limit { return func(l *limits) { l.lag, l.maxLag = true, n } }

// MaxBehind: no partition more than d behind, measured from when the last message it
// applied was produced (its BehindS; 0 without lag, and one not known is more).
func MaxBehind(d time.Duration) Limit {
	return func(l *limits) { l.behind, l.maxBehindS = true, d.Seconds() }
}

// Beyond says which partitions assigned here are further behind the topic than the
// limits, in the words every reader uses ("" when none is, or none is given). It judges a
// ready status; Why says why one is not ready.
func (st *Status) Beyond(limit ...Limit) string {
	var l limits
	for _, f := range limit {
		f(&l)
	}
	var said []string
	if l.lag {
		var over []string
		for _, p := range st.Assigned {
			switch {
			case p.Lag == nil:
				over = append(over, fmt.Sprintf("%d (lag unknown)", p.Partition))
			case *p.Lag > l.maxLag:
				over = append(over, fmt.Sprintf("%d (lag %d)", p.Partition, *p.Lag))
			}
		}
		if len(over) > 0 {
			said = append(said, fmt.Sprintf("partitions more than %d messages behind: %s", l.maxLag,
				strings.Join(over[:min(20, len(over))], ", ")))
		}
	}
	if l.behind {
		var over []string
		for _, p := range st.Assigned {
			switch {
			case p.BehindS == nil:
				over = append(over, fmt.Sprintf("%d (unknown)", p.Partition))
			case *p.BehindS > l.maxBehindS:
				over = append(over, fmt.Sprintf("%d (%.0f s)", p.Partition, *p.BehindS))
			}
		}
		if len(over) > 0 {
			said = append(said, fmt.Sprintf("partitions more than %.1f s behind: %s", l.maxBehindS,
				strings.Join(over[:min(20, len(over))], ", ")))
		}
	}
	return strings.Join(said, "; ")
}

// WaitReady polls Status every 0.05 s until the cache is ready and within the limits, if
// any are given, or ctx is done. While nothing is at the name (the cache being destroyed
// and created again) it goes on waiting; any other error ends it. Past ctx, its error is
// ErrNotReady, saying why not, and ctx's error: errors.Is(err, context.DeadlineExceeded)
// (or context.Canceled) holds.
func (c *Cache) WaitReady(ctx context.Context, limit ...Limit) (Status, error) {
	start := time.Now()
	tick := time.NewTicker(waitReadyPollNS)
	defer tick.Stop()
	for {
		st, err := c.Status()
		why := st.Why
		if err == nil && st.Ready {
			if why = st.Beyond(limit...); why == "" {
				return st, nil
			}
		}
		if err != nil && !errors.Is(err, ErrNotFound) {
			return st, err
		}
		select {
		case <-ctx.Done():
			var e *Error
			if errors.As(err, &e) {
				why = e.Detail
			}
			return st, &Error{Cache: c.name, Kind: ErrNotReady, Err: ctx.Err(),
				Detail: fmt.Sprintf("not ready after %.1f s (%v): %s", time.Since(start).Seconds(), ctx.Err(), why)}
		case <-tick.C:
		}
	}
}

// control reads a segment's control area: header words with atomic loads, byte runs copied.
type control struct {
	s   *segment
	now int64 // now on the age clock (H_AGE_CLOCK)
}

func (r control) word(i int) int64 { return atomic.LoadInt64(&r.s.header[i]) }

// text is n bytes from header word w, copied.
func (r control) text(w int, n int64) []byte { return bytes.Clone(r.s.data[w*word : int64(w*word)+n]) }

// age is the seconds since the time in header word w on the age clock, never below 0;
// nil when the word holds no time.
func (r control) age(w int) *float64 {
	t := r.word(w)
	if t <= 0 {
		return nil
	}
	return ptr(max(0, float64(r.now-t)/1e9))
}

// worker is a worker row in use, judged (section 14, "The workers").
// down is why a partition's worker (nil: no such row in use) applies nothing now; nil: up
// and beating. A stale worker has a heartbeat, so its age.
func down(w *WorkerStatus) *string {
	switch {
	case w == nil:
		return ptr("not running")
	case w.State != "up":
		return ptr(w.State)
	case w.Stale:
		return ptr(fmt.Sprintf("stale, no heartbeat for %.0f s", *w.HeartbeatAgeS))
	case w.WaitingForBucket != nil:
		return ptr(fmt.Sprintf("waiting for bucket %d's lock, held by another live process", *w.WaitingForBucket))
	}
	return nil
}

func status(s *segment, name string) Status {
	r := control{s: s, now: wallNS()}
	if r.word(hAgeClock) == ageClockMonotonic {
		r.now = monotonicNS()
	}
	st := Status{Name: name, Assigned: []PartitionStatus{}, Unassigned: []int{}, Elsewhere: []int{},
		GroupOthers: []GroupMember{}, GapPartitions: []int{}, Workers: []WorkerStatus{}}
	// an assignment is published row by row: the rows are read between two looks at these
	rebalances, assigning := r.word(hRebalances), r.word(hAssigning)
	n := int(r.word(hPartitions))
	if n < 0 || n > maxPartitions {
		n = 0
	}
	st.Partitions = n
	if tl := r.word(hTopicLen); tl >= 0 && tl <= topicMax {
		st.Topic = decodeUTF8(r.text(hTopic, tl))
	}
	gap := make([]bool, n)
	for p := range n {
		if gap[p] = uint64(r.word(hGapBits+p/64))>>(p%64)&1 != 0; gap[p] {
			st.GapPartitions = append(st.GapPartitions, p)
		}
	}
	sup := r.word(hSupervisor)
	st.SupervisorAlive = s.owners.alive(sup, hSupervisor)
	if sup > 0 {
		st.SupervisorPID = ptr(sup >> 32)
	}
	// the applied times, kept by the supervisor H_PARTITION_TIMES names: trusted only while it is the cache's
	timed := sup != 0 && r.word(hPartitionTimes) == sup
	nowMS := time.Now().UnixMilli()
	// the partition rows before the worker rows: a worker counts before it publishes
	here := make([]bool, n)
	for p := range n {
		row := s.partitions[p*rowWords : (p+1)*rowWords]
		if atomic.LoadInt64(&row[pAssigned]) == 0 {
			continue
		}
		here[p] = true
		applied, hw := atomic.LoadInt64(&row[pApplied]), atomic.LoadInt64(&row[pHighWater])
		ps := PartitionStatus{Partition: p, Applied: applied, HighWatermark: hw, Gap: gap[p],
			Latest:   max(atomic.LoadInt64(&row[pLatest]), hw, applied),
			CaughtUp: atomic.LoadInt64(&row[pCaughtUp]) != 0}
		if o := atomic.LoadInt64(&row[pOwner]); o >= 1 && o <= maxWorkers {
			ps.Worker = ptr(int(o - 1))
		}
		if ps.Latest >= 0 {
			ps.Lag = ptr(max(0, ps.Latest-max(applied, 0)))
			if t := atomic.LoadInt64(&row[pAppliedTime]); *ps.Lag == 0 {
				ps.BehindS = ptr(0.0)
			} else if timed && t > 0 {
				ps.BehindS = ptr(max(0, float64(nowMS-t)/1e3))
			}
		}
		st.Assigned = append(st.Assigned, ps)
	}
	st.Workers = r.workers(st.SupervisorAlive, st.Workers)
	byIndex := map[int]*WorkerStatus{}
	for i := range st.Workers {
		byIndex[st.Workers[i].Worker] = &st.Workers[i]
	}
	for i := range st.Assigned {
		p := &st.Assigned[i]
		var w *WorkerStatus
		if p.Worker != nil {
			w = byIndex[*p.Worker]
		}
		p.WorkerDown = down(w)
		p.CaughtUp = p.CaughtUp && p.WorkerDown == nil
	}
	for p := range n {
		if !here[p] {
			st.Unassigned = append(st.Unassigned, p)
		}
	}
	if st.SupervisorAlive {
		var members int64
		var elsewhere []int
		members, st.GroupOthers, elsewhere = r.group(n)
		for _, p := range elsewhere {
			if !here[p] {
				st.Elsewhere = append(st.Elsewhere, p)
			}
		}
		if members > 0 {
			st.GroupMembers = ptr(members)
		}
		st.SharedGroup = len(st.GroupOthers) > 0 || members > 1
	}
	settled := assigning == 0 && r.word(hAssigning) == 0 && r.word(hRebalances) == rebalances
	st.Assigning = !settled
	if st.SupervisorAlive {
		st.SupervisorHeartbeatAgeS = r.age(hSupervisorHeartbeat)
		st.SupervisorStale = st.SupervisorHeartbeatAgeS != nil && *st.SupervisorHeartbeatAgeS > staleHeartbeatS
		st.Broker, st.BrokerWaitingS = r.broker()
		st.LookupError, st.LookupFailingS = r.lookupFailure()
		st.GapsAccepted = r.word(hAcceptGaps) != 0
	}
	all, gaps := true, false
	for _, p := range st.Assigned {
		all = all && p.CaughtUp
		gaps = gaps || p.Gap
	}
	st.GapOffsets = r.word(hGapOffsets)
	whole := n > 0 && len(st.Assigned) == n
	waiting := st.Broker != nil && *st.Broker == brokerNames[brokerWaiting]
	st.CaughtUp = settled && st.SupervisorAlive && !st.SupervisorStale && whole && !waiting && all
	st.Ready = st.CaughtUp && (!gaps || st.GapsAccepted)
	st.Reason, st.Why = reasonWhy(&st)
	return st
}

// workers appends each worker row in use to out, in row order, judged as section 14 says.
func (r control) workers(supAlive bool, out []WorkerStatus) []WorkerStatus {
	s := r.s
	bound := int64(0)
	if supAlive {
		bound = r.word(hWorkerStaleNS)
	}
	waits := map[int64]int64{} // owner word -> bucket + 1 whose lock a writer of that process waits for
	for w := range maxWriters {
		o, wait := atomic.LoadInt64(&s.writers[w*rowWords+wOwner]), atomic.LoadInt64(&s.writers[w*rowWords+wWait])
		if o != 0 && wait > 0 && wait <= NBuckets {
			waits[o] = wait
		}
	}
	for i := range maxWorkers {
		row := s.workers[i*rowWords : (i+1)*rowWords]
		owner, beat := atomic.LoadInt64(&row[kOwner]), atomic.LoadInt64(&row[kHeartbeat])
		if owner == 0 && atomic.LoadInt64(&row[kStarts]) == 0 {
			continue
		}
		alive := s.owners.alive(owner, workersOff/word+int64(i)*rowWords+kOwner)
		published, failures, restartAt := "", int64(0), int64(0)
		if supAlive {
			handle := r.word(hWorkerHandles + i)
			if code := handle & 0xFF; code >= 1 && code <= int64(len(workerStates)) {
				published = workerStates[code-1]
			}
			failures, restartAt = handle>>8&0xFFFF, handle>>24
		}
		w := WorkerStatus{Worker: i, Alive: alive, RestartFailures: failures,
			Stale:  alive && bound > 0 && beat > 0 && r.now-beat > bound,
			Starts: atomic.LoadInt64(&row[kStarts]), Adds: atomic.LoadInt64(&row[kAdds]),
			Deletes: atomic.LoadInt64(&row[kDeletes]), Messages: atomic.LoadInt64(&row[kMessages]),
			Malformed: atomic.LoadInt64(&row[kMalformed]), UnknownActions: atomic.LoadInt64(&row[kUnknown])}
		switch {
		case alive && (published == "stopping" || published == "backing-off"):
			w.State = published
		case alive:
			w.State = "up"
		case !supAlive:
			w.State = "stopped"
		case published == "backing-off" || published == "stopping" || published == "stopped":
			w.State = published
		default: // a worker claims its row once it is up; until then its supervisor starts it
			w.State = "starting"
		}
		if owner != 0 {
			w.PID = ptr(owner >> 32)
		}
		if restartAt > 0 && published == "backing-off" {
			w.NextRestartS = ptr(float64(restartAt) / 10)
		}
		if beat != 0 {
			w.HeartbeatAgeS = ptr(float64(r.now-beat) / 1e9)
		}
		if wait, ok := waits[owner]; alive && ok {
			w.WaitingForBucket = ptr(wait - 1)
		}
		out = append(out, w)
	}
	return out
}

// group reads the group words between two looks at H_GROUP_CHECKED (up to 5 tries, else
// no group): the members (0 unknown), the other members with the partitions each holds,
// and the partitions another member holds, in order.
func (r control) group(n int) (members int64, others []GroupMember, elsewhere []int) {
	for range 5 {
		v := r.word(hGroupChecked)
		if v <= 0 {
			break
		}
		tl, m := r.word(hGroupTextLen), r.word(hGroupMembers)
		raw := r.text(hGroupText, min(max(tl, 0), groupTextMax))
		where := r.text(hElsewhere, int64(n))
		if r.word(hGroupChecked) != v {
			continue // torn: the supervisor was writing
		}
		others = parseMembers(raw)
		var unlisted []int
		for p, b := range where {
			if b == 0 {
				continue
			}
			elsewhere = append(elsewhere, p)
			if i := int(b) - 1; i < len(others) {
				others[i].Partitions = append(others[i].Partitions, p)
			} else {
				unlisted = append(unlisted, p)
			}
		}
		if unlisted != nil {
			others = append(others, GroupMember{ClientID: "?", Host: "?", Partitions: unlisted})
		}
		return m, others, elsewhere
	}
	return 0, []GroupMember{}, nil
}

// parseMembers reads the group text: a JSON list of objects, each reduced to the strings
// client_id, host and instance_id (missing: ""); anything else is an empty list.
func parseMembers(raw []byte) []GroupMember {
	out := []GroupMember{}
	if len(raw) == 0 || !utf8.Valid(raw) {
		return out
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return out
	}
	for _, item := range list {
		var o map[string]json.RawMessage
		if json.Unmarshal(item, &o) != nil || o == nil {
			return []GroupMember{}
		}
		out = append(out, GroupMember{ClientID: pyStr(o["client_id"]), Host: pyStr(o["host"]),
			InstanceID: pyStr(o["instance_id"]), Partitions: []int{}})
	}
	return out
}

// pyStr is a JSON value as Python's str() gives it for the values a member's field may
// hold: a string as it is, missing "", null None, true True, an integer its digits; any
// other value its JSON text.
func pyStr(v json.RawMessage) string {
	var s string
	switch t := string(bytes.TrimSpace(v)); {
	case t == "":
		return ""
	case t == "null":
		return "None"
	case json.Unmarshal(v, &s) == nil:
		return s
	case t == "true", t == "false":
		return strings.ToUpper(t[:1]) + t[1:]
	default:
		if i, err := strconv.ParseInt(t, 10, 64); err == nil {
			return strconv.FormatInt(i, 10)
		}
		return t
	}
}

var brokerNames = map[int64]string{brokerUnknown: "connecting", brokerUp: "up", brokerWaiting: "waiting for the broker"}

// broker is the broker's state as the live supervisor published it, and how long it has
// been waited for (0 when the wait's start holds no time), nil unless waiting.
func (r control) broker() (*string, *float64) {
	state := r.word(hBrokerState)
	name, ok := brokerNames[state]
	if !ok {
		name = brokerNames[brokerUnknown]
	}
	if state != brokerWaiting {
		return &name, nil
	}
	if w := r.age(hBrokerSince); w != nil {
		return &name, w
	}
	return &name, ptr(0.0)
}

// lookupFailure is the live supervisor's failing look-up of where partitions start: its
// text and age, read between two looks at its start (up to 5 tries, else none).
func (r control) lookupFailure() (string, *float64) {
	for range 5 {
		since := r.word(hLookupFailingSince)
		if since == 0 {
			break
		}
		raw := r.text(hLookupText, min(max(r.word(hLookupTextLen), 0), lookupTextMax))
		if since > 0 && r.word(hLookupFailingSince) == since {
			return decodeUTF8(raw), ptr(max(0, float64(r.now-since)/1e9))
		}
	}
	return "", nil
}

// reasonWhy is the first row of the table of section 14 that holds: a word and a sentence.
func reasonWhy(st *Status) (string, string) {
	switch {
	case st.Ready:
		return "ready", ""
	case !st.SupervisorAlive:
		return "no-supervisor", "no live supervisor"
	case st.SupervisorStale:
		return "supervisor-stale", fmt.Sprintf("the supervisor (pid %d) has not gone round its loop for %.0f s: "+
			"stopped or hung", *st.SupervisorPID, *st.SupervisorHeartbeatAgeS)
	case st.Broker != nil && *st.Broker == brokerNames[brokerWaiting]:
		return "broker-waiting", fmt.Sprintf("waiting for the Kafka broker for %.0f s", *st.BrokerWaitingS)
	case st.LookupError != "":
		return "lookup-error", fmt.Sprintf("%d of %d partitions wait to be handed out: the broker answers, but %s "+
			"(failing for %.0f s)", len(st.Unassigned), st.Partitions, st.LookupError, *st.LookupFailingS)
	case len(st.Assigned) == 0 && len(st.Elsewhere) == 0:
		return "no-partitions", "no partitions assigned yet"
	case st.Assigning:
		return "assigning", "an assignment is being published"
	case len(st.Unassigned) > 0:
		text := fmt.Sprintf("%d of %d partitions not assigned to this cache", len(st.Unassigned), st.Partitions)
		if len(st.Elsewhere) > 0 {
			who := make([]string, len(st.GroupOthers))
			for i, o := range st.GroupOthers {
				who[i] = o.ClientID + " on " + o.Host
			}
			text += fmt.Sprintf(" (%d held by another member of the group: %s)", len(st.Elsewhere),
				strings.Join(who, ", "))
		}
		return "unassigned", text
	}
	var lagging []string
	for _, p := range st.Assigned {
		if p.CaughtUp {
			continue
		}
		lag := "unknown"
		if p.Lag != nil {
			lag = strconv.FormatInt(*p.Lag, 10)
		}
		switch {
		case p.WorkerDown == nil || *p.WorkerDown == "":
			lagging = append(lagging, fmt.Sprintf("%d (lag %s)", p.Partition, lag))
		case p.Worker == nil:
			lagging = append(lagging, fmt.Sprintf("%d (lag %s, no worker)", p.Partition, lag))
		default:
			lagging = append(lagging, fmt.Sprintf("%d (lag %s, worker %d %s)", p.Partition, lag, *p.Worker,
				*p.WorkerDown))
		}
	}
	if len(lagging) == 0 && len(st.GapPartitions) > 0 {
		return "gap", fmt.Sprintf("retention gap: the topic deleted %s offsets of partitions %s before this cache "+
			"had them, so the table lacks what they held; restore a snapshot taken before, or start the supervisor "+
			"with --accept-gaps to serve it as it is", commas(st.GapOffsets), pyList(st.GapPartitions[:min(32,
			len(st.GapPartitions))]))
	}
	return "lagging", "partitions not caught up: " + strings.Join(lagging[:min(20, len(lagging))], ", ")
}

// commas writes an integer as Python's {:,} does: 1,234,567.
func commas(v int64) string {
	digits := strconv.FormatInt(v, 10)
	sign := ""
	if digits[0] == '-' {
		sign, digits = "-", digits[1:]
	}
	var b strings.Builder
	for i, d := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	return sign + b.String()
}

// pyList writes a list of ints as Python does: [0, 1, 2].
func pyList(v []int) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.Itoa(x)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// decodeUTF8 decodes b as Python's bytes.decode("utf-8", "replace") does: each maximal
// invalid subsequence becomes one U+FFFD.
func decodeUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var out strings.Builder
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r != utf8.RuneError || size > 1 {
			out.Write(b[:size])
			b = b[size:]
			continue
		}
		out.WriteRune(utf8.RuneError)
		b = b[invalidPrefix(b):]
	}
	return out.String()
}

// invalidPrefix is the length of the maximal subpart of an ill-formed sequence at b[0]
// (Unicode's "substitution of maximal subparts"): the lead byte and the continuation
// bytes that could still begin a valid sequence with it.
func invalidPrefix(b []byte) int {
	lo, hi, need := byte(0x80), byte(0xBF), 0
	switch c := b[0]; {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		lo, need = 0xA0, 2
	case c == 0xED:
		hi, need = 0x9F, 2
	case c >= 0xE1 && c <= 0xEF:
		need = 2
	case c == 0xF0:
		lo, need = 0x90, 3
	case c == 0xF4:
		hi, need = 0x8F, 3
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	default:
		return 1
	}
	i := 1
	for ; i <= need && i < len(b); i++ {
		if b[i] < lo || b[i] > hi {
			break
		}
		lo, hi = 0x80, 0xBF
	}
	return i
}

func ptr[T any](v T) *T { return &v }
