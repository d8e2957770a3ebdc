package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	shmcache "github.com/shmcache/shmcache/go"
	"github.com/shmcache/shmcache/go/internal/goldencache"
	"github.com/shmcache/shmcache/go/txmeta"
	"golang.org/x/sys/unix"
)

// The tests run this test binary as the command (SHMCACHE_GO_MAIN=1 makes it main()).
func TestMain(m *testing.M) {
	if os.Getenv("SHMCACHE_GO_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func commandLine(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "SHMCACHE_GO_MAIN=1")
	return cmd
}

// shmcacheGo runs the command to its end: stdout, stderr, exit status.
func shmcacheGo(t *testing.T, args ...string) (string, string, int) {
	cmd := commandLine(args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if e, ok := err.(*exec.ExitError); ok {
		code = e.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func gunzip(t *testing.T, path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// shmName is a cache name of the test's own; its file and companion go when the test ends.
func shmName(t *testing.T, what string) (string, string) {
	name := fmt.Sprintf("go-cmd-%s-%d", what, os.Getpid())
	path := "/dev/shm/" + name
	os.Remove(path)
	t.Cleanup(func() {
		os.Remove(path)
		os.Remove("/dev/shm/.shmcache-" + name + ".readers")
	})
	return name, path
}

// put writes data at path as a new file (one rename), with this mode whatever the umask.
func put(t *testing.T, path string, data []byte, mode os.FileMode) {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, mode)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

type goldenKey struct {
	Key   string  `json:"key"`
	Value *string `json:"value"`
}

// installGolden puts a golden segment at a name of the test's own; for the base segment
// it returns its keys and expected answers too.
func installGolden(t *testing.T, file, what string) (string, []goldenKey) {
	name, path := shmName(t, what)
	put(t, path, gunzip(t, "../../../golden/"+file), 0o600)
	raw, _ := os.ReadFile("../../../golden/expect.json")
	var doc struct {
		Cases map[string]struct {
			Keys []goldenKey `json:"keys"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return name, doc.Cases[strings.TrimSuffix(file, ".shm.gz")].Keys
}

func TestGetAnswersEveryGoldenKeyInOneCall(t *testing.T) {
	name, keys := installGolden(t, "base.shm.gz", "get")
	args := []string{"get", name}
	var want []string
	var hits []string
	empty := false
	for _, k := range keys {
		args = append(args, k.Key)
		if k.Value == nil {
			want = append(want, "-")
		} else {
			want = append(want, *k.Value)
			hits = append(hits, k.Key)
			empty = empty || *k.Value == ""
		}
	}
	if !empty || len(hits) == len(keys) {
		t.Fatal("the base golden segment should have an empty value and a miss")
	}
	out, errs, code := shmcacheGo(t, args...)
	if code != 1 || strings.Join(want, "\n")+"\n" != out || errs != "" {
		t.Fatalf("some keys missed: exit %d (want 1), stderr %q; got\n%s\nwant\n%s", code, errs, out,
			strings.Join(want, "\n"))
	}
	out, errs, code = shmcacheGo(t, append([]string{"get", "--owner", "root", name}, hits...)...)
	if code != 0 || strings.Count(out, "\n") != len(hits) || strings.Contains(out, "-") {
		t.Fatalf("every key hit: exit %d (want 0), stderr %q\n%s", code, errs, out)
	}
	// --decode txmeta: the same keys, the same exit; a value found is its decode, or not a
	// txmeta value (the golden's values are not), a miss is still "-"
	var decoded []string
	for _, w := range want {
		v, _ := hex.DecodeString(w)
		var m txmeta.Meta
		switch {
		case w == "-":
			decoded = append(decoded, "-")
		case m.Decode(v) != nil:
			decoded = append(decoded, `{"valid":false}`)
		default:
			raw, _ := json.Marshal(&m)
			decoded = append(decoded, string(raw))
		}
	}
	out, errs, code = shmcacheGo(t, append([]string{"get", "--decode", "txmeta"}, args[1:]...)...)
	if code != 1 || strings.Join(decoded, "\n")+"\n" != out || errs != "" {
		t.Fatalf("--decode txmeta: exit %d (want 1), stderr %q; got\n%s\nwant\n%s", code, errs, out,
			strings.Join(decoded, "\n"))
	}
}

// stats and status print one JSON object with the contract's fields, --json or not.
func TestStatsAndStatusAreOneJSONObject(t *testing.T) {
	name, _ := installGolden(t, "base.shm.gz", "json")
	fields := map[string][]string{
		"stats": {"name", "entries", "bytes_used", "capacity_bytes", "max_entries", "memory", "evictions",
			"lock_takeovers", "sets", "deletes", "writers", "reader_hits", "reader_misses", "reader_batches", "readers",
			"corruptions", "key_size", "max_value", "buckets", "layout_version", "creation_id", "created_s"},
		"status": {"name", "topic", "partitions", "supervisor_pid", "supervisor_alive", "supervisor_stale",
			"supervisor_heartbeat_age_s", "broker", "broker_waiting_s", "lookup_error", "lookup_failing_s",
			"assigning", "assigned", "unassigned", "elsewhere", "shared_group", "group_members", "group_others",
			"gap_partitions", "gap_offsets", "gaps_accepted", "caught_up", "ready", "reason", "why"},
	}
	for cmd, want := range fields {
		for _, args := range [][]string{{cmd, name}, {cmd, "--json", name}, {cmd, name, "--json", "--owner=root"}} {
			out, errs, code := shmcacheGo(t, args...)
			var v map[string]any
			if code != 0 || strings.Count(out, "\n") != 1 || json.Unmarshal([]byte(out), &v) != nil {
				t.Fatalf("%v: exit %d, stderr %q\n%s", args, code, errs, out)
			}
			for _, f := range want {
				if _, ok := v[f]; !ok {
					t.Errorf("%v: no field %s", args, f)
				}
			}
			if cmd == "stats" && v["entries"] != 19.0 {
				t.Errorf("%v: entries %v", args, v["entries"])
			}
			if cmd == "status" && (v["reason"] != "no-supervisor" || v["why"] != "no live supervisor") {
				t.Errorf("%v: reason %v, why %v", args, v["reason"], v["why"])
			}
		}
	}
}

const nobody = 65534 // the tests run as root and chown files to nobody

// Every error is one stderr line, `shmcache-go: KIND: message`, the message naming the
// cache, and exit status 2; the kinds are the contract's words.
func TestErrorsAreOneLineWithTheirKind(t *testing.T) {
	base, keys := installGolden(t, "base.shm.gz", "errors")
	key := keys[0].Key
	corrupt, _ := installGolden(t, "header_size_394000.shm.gz", "corrupt")
	version, _ := installGolden(t, "header_version_2.shm.gz", "version")
	notACache, _ := installGolden(t, "header_magic_1234.shm.gz", "magic")
	theirs, _ := installGolden(t, "base.shm.gz", "theirs")
	if err := os.Chown("/dev/shm/"+theirs, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	open, _ := installGolden(t, "base.shm.gz", "open")
	if err := os.Chmod("/dev/shm/"+open, 0o666); err != nil {
		t.Fatal(err)
	}
	fifo, fifoPath := shmName(t, "fifo")
	if err := unix.Mkfifo(fifoPath, 0o600); err != nil {
		t.Fatal(err)
	}
	missing, _ := shmName(t, "missing")
	for _, c := range []struct {
		kind string
		args []string
	}{
		{"bad-argument", nil},
		{"bad-argument", []string{"frob", base}},
		{"bad-argument", []string{"get", base}},
		{"bad-argument", []string{"get", base, "zz"}},
		{"bad-argument", []string{"get", base, "00"}}, // not the cache's key size
		{"bad-argument", []string{"get", "../etc/passwd", key}},
		{"bad-argument", []string{"get", "--owner", "no-such-user-here", base, key}},
		{"bad-argument", []string{"get", "--json", base, key}},
		{"bad-argument", []string{"get", "--decode", "hex", base, key}},
		{"bad-argument", []string{"get", "--decode"}},
		{"bad-argument", []string{"stats", "--decode", "txmeta", base}},
		{"bad-argument", []string{"stats", base, "extra"}},
		{"bad-argument", []string{"watch", base, key, "soon"}},
		{"bad-argument", []string{"watch", base, "zz", "1"}},
		{"bad-argument", []string{"watch", "../x", key, "1"}},
		{"bad-argument", []string{"wait-ready", "--timeout", "-1", base}},
		{"bad-argument", []string{"wait-ready", "--timeout"}},
		{"not-found", []string{"stats", missing}},
		{"not-found", []string{"get", missing, key}},
		{"not-a-cache", []string{"status", notACache}},
		{"not-a-cache", []string{"get", fifo, key}},
		{"corrupt", []string{"get", corrupt, key}},
		{"unknown-version", []string{"stats", version}},
		{"wrong-owner", []string{"get", "--owner", "root", theirs, key}},
		{"wrong-owner", []string{"wait-ready", "--owner", "0", "--timeout", "5", theirs}},
		{"unsafe-mode", []string{"get", open, key}},
		{"unsafe-mode", []string{"status", "--owner", "root", open}},
	} {
		out, errs, code := shmcacheGo(t, c.args...)
		prefix := "shmcache-go: " + c.kind + ": "
		if code != 2 || out != "" || strings.Count(errs, "\n") != 1 || !strings.HasPrefix(errs, prefix) ||
			(len(c.args) > 1 && c.kind != "bad-argument" && !strings.Contains(errs, c.args[len(c.args)-1]) &&
				!strings.Contains(errs, c.args[len(c.args)-2])) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q...", c.args, code, out, errs, prefix)
		}
	}
}

// lines reads a running command's stdout line by line.
type lines struct {
	ch  chan string
	cmd *exec.Cmd
}

func start(t *testing.T, args ...string) *lines {
	cmd := commandLine(args...)
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	l := &lines{ch: make(chan string, 100), cmd: cmd}
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			l.ch <- s.Text()
		}
		close(l.ch)
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill() // by pid: only the process this test started
			cmd.Wait()
		}
	})
	return l
}

var watchLine = regexp.MustCompile(`^(\d+\.\d{3}) (hit [0-9a-f]*|miss|error [a-z-]+: .+)$`)

// next is the next line, which must match pattern (10 s at most), as a watch line.
func (l *lines) next(t *testing.T, pattern string) string {
	t.Helper()
	select {
	case line, ok := <-l.ch:
		if !ok {
			t.Fatalf("the command ended; want a line %q", pattern)
		}
		if !watchLine.MatchString(line) || !regexp.MustCompile(pattern).MatchString(line) {
			t.Fatalf("line %q; want a watch line matching %q", line, pattern)
		}
		return line
	case <-time.After(10 * time.Second):
		t.Fatalf("no line after 10 s; want one matching %q", pattern)
	}
	return ""
}

// watch follows the name: a line for each change of outcome, through a destroyed cache,
// a FIFO, a stranger's bytes, a file others may write, a new cache, a cache cut short
// under it and its companion cut short; then it ends at its time, exit 0.
func TestWatchFollowsTheName(t *testing.T) {
	name, keys := installGolden(t, "base.shm.gz", "watch")
	path := "/dev/shm/" + name
	var key, value string
	for _, k := range keys {
		if k.Value != nil && *k.Value != "" {
			key, value = k.Key, *k.Value
			break
		}
	}
	w := start(t, "watch", name, key, "120")
	w.next(t, " hit "+value+"$")
	os.Remove(path)
	w.next(t, " error not-found: ")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	w.next(t, " error not-a-cache: .*a FIFO")
	noise := make([]byte, 1<<20)
	rand.Read(noise)
	put(t, path, noise, 0o600) // replaces the FIFO at once; the same kind of outcome: no line
	put(t, path, gunzip(t, "../../../golden/base.shm.gz"), 0o666)
	w.next(t, " error unsafe-mode: ")
	segment := gunzip(t, "../../../golden/base.shm.gz")
	comp := "/dev/shm/.shmcache-" + name + ".readers"
	put(t, comp, companion(segment), 0o660) // the readers' companion of this cache: the watch counts there
	put(t, path, segment, 0o600)
	w.next(t, " hit "+value+"$")
	waitFor(t, "the watch to count its lookups in the companion", func() bool { return companionHits(t, comp) > 0 })
	if err := os.Truncate(comp, 0); err != nil { // cut short: the counters go off, lookups go on
		t.Fatal(err)
	}
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	w.next(t, " error corrupt: .*cut short") // the next line: the companion changed no outcome
	put(t, path, gunzip(t, "../../../golden/base.shm.gz"), 0o600)
	w.next(t, " hit "+value+"$")
	if w.cmd.ProcessState != nil {
		t.Fatal("the watch ended early")
	}

	missing, _ := shmName(t, "watch-missing")
	out, errs, code := shmcacheGo(t, "watch", missing, key, "0.2")
	if code != 0 || !watchLine.MatchString(strings.TrimSpace(out)) || !strings.Contains(out, " error not-found: ") ||
		errs != "" {
		t.Fatalf("a watch of 0.2 s: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// companion is a readers' companion (docs/segment-format.md, section 13) for segment.
func companion(segment []byte) []byte {
	const magic, version, rows = 0x31524452434D4853, 2, 1024
	data := make([]byte, 4096+rows*64)
	binary.LittleEndian.PutUint64(data[0:], magic)
	binary.LittleEndian.PutUint64(data[8:], version)
	copy(data[16:24], segment[8*8:9*8]) // the cache's creation id
	return data
}

// companionHits sums the hits of a companion's rows (0 if it is cut short).
func companionHits(t *testing.T, path string) (n uint64) {
	data, _ := os.ReadFile(path)
	for off := 4096; off+16 <= len(data); off += 64 {
		n += binary.LittleEndian.Uint64(data[off+8:])
	}
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// controlReady puts golden/control's ready case at the name, its live owners two processes
// this test starts (killed by pid at its end) and its ages now.
func controlReady(t *testing.T, name string) {
	cases, err := goldencache.ControlCases("../../../golden/control")
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]int64{}
	for _, role := range []string{"supervisor", "worker"} {
		p := exec.Command("sleep", "600")
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Process.Kill(); p.Wait() })
		owners[role] = shmcache.OwnerWord(p.Process.Pid)
	}
	remove, err := cases["control_ready"].Install("../../../golden/control", name, owners)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remove)
}

// wait-ready: not ready by the timeout is exit 1 saying why; a cache that becomes ready
// (created while it waits: nothing at the name meanwhile) is its status and exit 0.
func TestWaitReady(t *testing.T) {
	name, _ := installGolden(t, "base.shm.gz", "wait")
	out, errs, code := shmcacheGo(t, "wait-ready", "--timeout", "0.2", name)
	if code != 1 || out != "" || !strings.HasPrefix(errs, "shmcache-go: not-ready: ") ||
		!strings.Contains(errs, "no live supervisor") || strings.Count(errs, "\n") != 1 {
		t.Fatalf("no supervisor: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	later, _ := shmName(t, "wait-later")
	w := start(t, "wait-ready", "--timeout", "60", later)
	controlReady(t, later)
	select {
	case line := <-w.ch:
		var st map[string]any
		if json.Unmarshal([]byte(line), &st) != nil || st["ready"] != true || st["reason"] != "ready" {
			t.Fatalf("wait-ready printed %q", line)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("wait-ready said nothing 30 s after the cache was ready")
	}
	if err := w.cmd.Wait(); err != nil {
		t.Fatalf("wait-ready: %v", err)
	}
}

// TestHelpPrintsTheUsage: --help, -h and help, alone or after a command, print every
// command's usage on stdout and exit 0; an option after `--` is an argument, not a request.
func TestHelpPrintsTheUsage(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"get", "--help"}, {"status", "-h", "x"}} {
		out, errs, code := shmcacheGo(t, args...)
		if code != 0 || errs != "" || !strings.HasPrefix(out, "usage: shmcache-go") {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
		for _, command := range []string{"get", "watch", "stats", "status", "wait-ready"} {
			if !strings.Contains(out, "\n  "+command+" ") {
				t.Errorf("%v: the usage lacks %s:\n%s", args, command, out)
			}
		}
	}
	if _, errs, code := shmcacheGo(t, "get", "--", "--help"); code != 2 || !strings.Contains(errs, "bad-argument") {
		t.Errorf("get -- --help: exit %d, stderr %q (a name, not a request for help)", code, errs)
	}
}
