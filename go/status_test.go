package shmcache

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/shmcache/shmcache/go/internal/goldencache"
	"github.com/shmcache/shmcache/go/internal/testpython"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pyControl is shmtest.control_writer (tests/lib/shmtest/control_writer.py): a real Python Writer whose control area it sets as a
// scenario says, and the Python reader's status() of it (or of another cache).
type pyControl struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
	done  chan error
}

// startControl starts shmtest.control_writer on a cache of the test's own and waits for its
// "ready"; the process is stopped by pid and its cache removed when the test ends.
func startControl(t *testing.T, what string) *pyControl {
	name, _ := shmName(t, what)
	return startControlNamed(t, name)
}

func startControlNamed(t *testing.T, name string) *pyControl {
	cmd := exec.Command(testpython.WithHelpers(t), "-P", "-m", "shmtest.control_writer", name)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pyControl{name: name, cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout), done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() { p.stop(t) })
	p.lines.Buffer(nil, 1<<20)
	if !p.lines.Scan() || p.lines.Text() != "ready" {
		t.Fatalf("shmtest.control_writer did not start: %q", p.lines.Text())
	}
	return p
}

// stop closes the script's input, which destroys its cache, and waits for it to exit (it is
// killed, by pid, if it has not within 30 s).
func (p *pyControl) stop(t *testing.T) {
	if p.stdin == nil {
		return
	}
	p.stdin.Close()
	p.stdin = nil
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		t.Errorf("shmtest.control_writer did not exit at the end of its input")
	}
}

// ask sends a line and returns the JSON object of the answer.
func (p *pyControl) ask(t *testing.T, line string) map[string]any {
	fmt.Fprintln(p.stdin, line)
	if !p.lines.Scan() {
		t.Fatalf("shmtest.control_writer did not answer %q", line)
	}
	var v map[string]any
	if err := json.Unmarshal(p.lines.Bytes(), &v); err != nil {
		t.Fatalf("%q: %v", p.lines.Text(), err)
	}
	return v
}

// asJSON is a Go status as its JSON object.
func asJSON(t *testing.T, st Status) map[string]any {
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// The fields of the contract's status, and of each assigned partition, and the ages among
// them: golden/contract.json, the contract as data.
var (
	statusFields, partitionFields, ageList = contractStatus()
	ageFields                              = setOf(ageList)
	seconds                                = regexp.MustCompile(`\d+ s\b`)
)

func contractStatus() (fields, partitionFields, ages []string) {
	data, err := os.ReadFile(filepath.Join("..", "golden", "contract.json"))
	if err != nil {
		panic(err)
	}
	var c struct {
		Status struct {
			Fields          []string `json:"fields"`
			PartitionFields []string `json:"partition_fields"`
			Ages            []string `json:"ages"`
		} `json:"status"`
	}
	if err := json.Unmarshal(data, &c); err != nil || len(c.Status.Fields) == 0 {
		panic(fmt.Sprintf("golden/contract.json: no status fields (%v)", err))
	}
	return c.Status.Fields, c.Status.PartitionFields, c.Status.Ages
}

func setOf(s []string) map[string]bool {
	m := map[string]bool{}
	for _, x := range s {
		m[x] = true
	}
	return m
}

// sameStatus compares the Go and the Python reader's status field by field: every field of
// the contract, ages within 2 s (the two read at different times), and the sentences
// with their whole numbers of seconds masked.
func sameStatus(t *testing.T, what string, gov, pyv map[string]any) {
	t.Helper()
	for _, f := range statusFields {
		g, p := gov[f], pyv[f]
		if _, ok := gov[f]; !ok {
			t.Errorf("%s: the Go status has no field %s", what, f)
			continue
		}
		if _, ok := pyv[f]; !ok {
			t.Errorf("%s: the Python status has no field %s", what, f)
			continue
		}
		switch {
		case ageFields[f]:
			gf, gok := g.(float64)
			pf, pok := p.(float64)
			if gok != pok || (gok && math.Abs(gf-pf) > 2) {
				t.Errorf("%s: %s: Go %v, Python %v", what, f, g, p)
			}
		case f == "workers": // row by row, below
		case f == "why":
			if seconds.ReplaceAllString(g.(string), "N s") != seconds.ReplaceAllString(p.(string), "N s") {
				t.Errorf("%s: why:\n  Go     %q\n  Python %q", what, g, p)
			}
		case f == "assigned":
			gl, pl := g.([]any), p.([]any)
			if len(gl) != len(pl) {
				t.Errorf("%s: %d partitions assigned in Go, %d in Python", what, len(gl), len(pl))
				continue
			}
			for i := range gl {
				gp, pp := gl[i].(map[string]any), pl[i].(map[string]any)
				for _, pf := range partitionFields {
					a, b := gp[pf], pp[pf]
					if s, ok := a.(string); ok && pf == "worker_down" {
						a = seconds.ReplaceAllString(s, "N s")
						if bs, ok := b.(string); ok {
							b = seconds.ReplaceAllString(bs, "N s")
						}
					}
					if af, ok := a.(float64); ok && pf == "behind_s" { // an age: the two read at different times
						if bf, ok := b.(float64); ok && math.Abs(af-bf) <= 2 {
							continue
						}
					}
					if !reflect.DeepEqual(a, b) {
						t.Errorf("%s: partition %v: %s: Go %#v, Python %#v", what, pp["partition"], pf, a, b)
					}
				}
			}
		default:
			if !reflect.DeepEqual(g, p) {
				t.Errorf("%s: %s: Go %#v, Python %#v", what, f, g, p)
			}
		}
	}
	sameWorkers(t, what, gov["workers"], pyv["workers"])
}

// sameWorkers compares the worker rows of the Go and the Python reader's status: the same
// rows, each with the same fields and values, heartbeat ages within 2 s.
func sameWorkers(t *testing.T, what string, g, p any) {
	t.Helper()
	gl, _ := g.([]any)
	pl, ok := p.([]any)
	if !ok || gl == nil || len(gl) != len(pl) {
		t.Errorf("%s: workers: Go %#v, Python %#v", what, g, p)
		return
	}
	for i := range pl {
		gw, pw := gl[i].(map[string]any), pl[i].(map[string]any)
		if len(gw) != len(pw) {
			t.Errorf("%s: worker row %d: Go's fields %v, Python's %v", what, i, keysOf(gw), keysOf(pw))
		}
		for k, pv := range pw {
			gv, ok := gw[k]
			gf, gok := gv.(float64)
			pf, pok := pv.(float64)
			switch {
			case !ok:
				t.Errorf("%s: worker row %d: no %s in Go's", what, i, k)
			case k == "heartbeat_age_s" && gok && pok:
				if math.Abs(gf-pf) > 2 {
					t.Errorf("%s: worker row %d: %s: Go %v, Python %v", what, i, k, gv, pv)
				}
			case !reflect.DeepEqual(gv, pv):
				t.Errorf("%s: worker row %d: %s: Go %#v, Python %#v", what, i, k, gv, pv)
			}
		}
	}
}

func keysOf(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Control areas set by a real Python Writer (a supervisor, workers, partitions, a group, a
// failing look-up, gaps, the broker, both age clocks): the Go reader's status is the
// Python reader's, field by field.
func TestStatusIsThePythonReaders(t *testing.T) {
	py := startControl(t, "status")
	c, err := Attach(py.name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, s := range []string{"ready", "no-supervisor", "dead-supervisor", "stale-supervisor", "broker-waiting",
		"broker-waiting-no-start", "broker-unknown-state", "lookup-error", "lookup-empty-text", "no-partitions",
		"assigning", "unassigned", "shared-group", "elsewhere-only", "group-odd-text", "group-bad-text", "lagging",
		"worker-not-running", "gap", "gap-accepted", "gap-unassigned", "wall-clock", "stopped"} {
		pyv := py.ask(t, "scenario "+s)
		st, err := c.Status()
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		sameStatus(t, s, asJSON(t, st), pyv)
		if st.Ready != (st.Reason == "ready") || st.Ready != (st.Why == "") {
			t.Errorf("%s: ready %v, reason %q, why %q", s, st.Ready, st.Reason, st.Why)
		}
	}
}

// fmtPtr writes a pointer's value, or null.
func fmtPtr[T any](v *T) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(*v)
}

// secondsPattern is a golden's why as a regular expression: {supervisor_pid} the pid,
// {s} any whole number of seconds.
func secondsPattern(why string, supPID int) *regexp.Regexp {
	return regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(strings.ReplaceAll(why, "{supervisor_pid}",
		strconv.Itoa(supPID))), regexp.QuoteMeta("{s}"), `\d+`) + "$")
}

// liveRole starts a process for a role of the golden control areas (killed by pid when the
// test ends) and returns its pid and owner word.
func liveRole(t *testing.T) (int, int64) {
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd.Process.Pid, OwnerWord(cmd.Process.Pid)
}

// holdLocks takes the owner locks of the words at these file offsets of path until the
// test ends (goldencache.HoldLocks).
func holdLocks(t *testing.T, path string, offsets []int64) {
	release, err := goldencache.HoldLocks(path, offsets)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
}

// The golden control areas, live owners and ages filled: the Go reader gives each case's
// expected ready, caught_up, reason and why, and the Python reader's status field by field.
func TestGoldenControlAreas(t *testing.T) {
	cases, err := goldencache.ControlCases("../golden/control")
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) < 15 {
		t.Fatalf("only %d golden control areas", len(cases))
	}
	supPID, supWord := liveRole(t)
	_, workerWord := liveRole(t)
	owners := map[string]int64{"supervisor": supWord, "worker": workerWord}
	py := startControl(t, "golden-control-py")
	names := make([]string, 0, len(cases))
	for n := range cases {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		gc := cases[n]
		t.Run(n, func(t *testing.T) {
			data, err := gc.Image("../golden/control", owners)
			if err != nil {
				t.Fatal(err)
			}
			name, path := shmName(t, "golden-control")
			replaceAt(t, path, data, 0o600)
			holdLocks(t, path, gc.Locked)
			c, err := Attach(name)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			st, err := c.Status()
			if err != nil {
				t.Fatal(err)
			}
			want := gc.Status
			if st.Ready != want.Ready || st.CaughtUp != want.CaughtUp || st.Reason != want.Reason ||
				!secondsPattern(want.Why, supPID).MatchString(st.Why) {
				t.Errorf("got ready %v, caught_up %v, reason %q, why %q\nwant %+v", st.Ready, st.CaughtUp, st.Reason,
					st.Why, want)
			}
			for _, p := range st.Assigned {
				w, ok := want.BehindS[strconv.Itoa(p.Partition)]
				if ok && !((w == nil && p.BehindS == nil) ||
					(w != nil && p.BehindS != nil && *w <= *p.BehindS && *p.BehindS <= *w+goldencache.BehindSlackS)) {
					t.Errorf("partition %d: behind_s %v, want %v", p.Partition, fmtPtr(p.BehindS), fmtPtr(w))
				}
			}
			for _, b := range gc.Bounds {
				var limit []Limit
				if b.MaxLag != nil {
					limit = append(limit, MaxLag(*b.MaxLag))
				}
				if b.MaxBehind != nil {
					limit = append(limit, MaxBehind(time.Duration(*b.MaxBehind*float64(time.Second))))
				}
				if got := st.Beyond(limit...); !secondsPattern(b.Why, supPID).MatchString(got) {
					t.Errorf("bound %v/%v: %q, want %q", fmtPtr(b.MaxLag), fmtPtr(b.MaxBehind), got, b.Why)
				}
			}
			sameStatus(t, n, asJSON(t, st), py.ask(t, "status "+name))
		})
	}
}

// WaitReady waits through a cache destroyed and created again (nothing at the name
// meanwhile), and returns once the new one is ready; past its context, its error is both
// ErrNotReady and the context's.
func TestWaitReadyWaitsForARecreatedCache(t *testing.T) {
	first := startControl(t, "wait-ready")
	first.ask(t, "scenario no-supervisor")
	c, err := Attach(first.name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = c.WaitReady(ctx)
	if !errors.Is(err, ErrNotReady) || !errors.Is(err, context.DeadlineExceeded) || Kind(err) != "not-ready" ||
		!strings.Contains(err.Error(), "no live supervisor") {
		t.Fatalf("WaitReady, no supervisor: %v", err)
	}
	first.stop(t) // the cache destroyed: nothing at the name
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err = c.WaitReady(ctx); !errors.Is(err, ErrNotReady) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReady, nothing at the name: %v; want it to wait until its context is done", err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if _, err = c.WaitReady(cctx); !errors.Is(err, ErrNotReady) || !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitReady, canceled: %v", err)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		st, err := c.WaitReady(ctx)
		if err == nil && (!st.Ready || st.Reason != "ready") {
			err = fmt.Errorf("returned a status not ready: %+v", st)
		}
		done <- err
	}()
	second := startControlNamed(t, first.name) // created again under its name
	second.ask(t, "scenario ready")
	if err := <-done; err != nil {
		t.Fatalf("WaitReady across the re-creation: %v", err)
	}
}

// installBehind puts golden/control's control_ready_behind at a name of the test's own:
// ready, partition 1 40 messages and 90 s behind, partition 2 3 messages behind, its time
// unknown.
func installBehind(t *testing.T) string {
	cases, err := goldencache.ControlCases("../golden/control")
	if err != nil {
		t.Fatal(err)
	}
	_, sup := liveRole(t)
	_, worker := liveRole(t)
	name, _ := shmName(t, "behind")
	remove, err := cases["control_ready_behind"].Install("../golden/control", name,
		map[string]int64{"supervisor": sup, "worker": worker})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remove)
	return name
}

// WaitReady with limits: a ready cache within them returns at once; past them, at its
// context's end, ErrNotReady (and the context's error) naming the partitions over them,
// in the contract's words.
func TestWaitReadyWithinLimits(t *testing.T) {
	c, err := Attach(installBehind(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if st, err := c.WaitReady(ctx, MaxLag(40)); err != nil || !st.Ready {
		t.Fatalf("within MaxLag(40): %v", err)
	}
	for _, tc := range []struct {
		limit []Limit
		says  string
	}{
		{[]Limit{MaxLag(39)}, ": partitions more than 39 messages behind: 1 (lag 40)"},
		{[]Limit{MaxBehind(time.Minute)}, ": partitions more than 60.0 s behind: 1 (9"},
		{[]Limit{MaxLag(3), MaxBehind(time.Hour)},
			"partitions more than 3 messages behind: 1 (lag 40); partitions more than 3600.0 s behind: 2 (unknown)"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		_, err := c.WaitReady(ctx, tc.limit...)
		cancel()
		if !errors.Is(err, ErrNotReady) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("past the limits: %v; want it to say %q", err, tc.says)
		}
	}
}
