package shmcache

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shmcache/shmcache/go/internal/testpython"
)

func testKey(i int) []byte {
	k := sha256.Sum256([]byte(fmt.Sprintf("go writer test %d", i)))
	return k[:]
}

// checkValue: v is a value testdata/writer.py wrote for key (its round's, whole); the round.
func checkValue(key, v []byte) (int64, error) {
	if len(v) < 16 || !bytes.Equal(v[:8], key[:8]) {
		return 0, fmt.Errorf("value %x is not key %x's", v, key)
	}
	r := int64(binary.LittleEndian.Uint64(v[8:16]))
	head := v[:16:16]
	sum := sha256.Sum256(head)
	want := append(append([]byte{}, head...), bytes.Repeat(sum[:], 5)...)[:61+(r*7+int64(key[0]))%81]
	if !bytes.Equal(v, want) {
		return 0, fmt.Errorf("torn or mixed value for key %x round %d: %x", key, r, v)
	}
	return r, nil
}

// A real Python writer overwrites every key round after round under Go readers (run with
// -race in the suite): every value read is one written for its key, never torn or mixed.
type pyWriter struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
	owner int64
}

// startWriter starts testdata/writer.py on cache name with n keys and waits for its
// "ready"; the process is stopped by pid and its segments removed when the test ends.
func startWriter(t *testing.T, name string, n int) *pyWriter {
	cmd := exec.Command(testpython.Path(t), "testdata/writer.py", name, strconv.Itoa(n))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if cmd.ProcessState == nil {
			cmd.Process.Kill() // by pid: only the process this test started
			cmd.Wait()
		}
		os.Remove(shmDir + "/" + name)
		os.Remove(companionPath(name))
	})
	w := &pyWriter{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
	if !w.lines.Scan() || !strings.HasPrefix(w.lines.Text(), "ready ") {
		t.Fatalf("the writer did not start: %q", w.lines.Text())
	}
	w.owner, _ = strconv.ParseInt(strings.Fields(w.lines.Text())[1], 10, 64)
	return w
}

// stop closes the writer's stdin and waits for its "done" line: the rounds it wrote and
// the readers' hits the Python reader's stats() saw. The cache is destroyed then.
func (w *pyWriter) stop(t *testing.T) (rounds, readerHits int64) {
	w.stdin.Close()
	if !w.lines.Scan() || !strings.HasPrefix(w.lines.Text(), "done ") {
		t.Fatalf("the writer did not finish: %q", w.lines.Text())
	}
	f := strings.Fields(w.lines.Text())
	rounds, _ = strconv.ParseInt(f[1], 10, 64)
	readerHits, _ = strconv.ParseInt(f[2], 10, 64)
	if err := w.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	return rounds, readerHits
}

func TestPythonWriterUnderGoReaders(t *testing.T) {
	name := fmt.Sprintf("go-writer-%d", os.Getpid())
	const n = 2000
	w := startWriter(t, name, n)
	if OwnerWord(w.cmd.Process.Pid) != w.owner || !IsAlive(w.owner) {
		t.Fatalf("owner word: Go says %d (alive %v), Python %d", OwnerWord(w.cmd.Process.Pid), IsAlive(w.owner), w.owner)
	}
	c, err := Attach(name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	keys := make([]byte, 0, n*32)
	for i := range n {
		keys = append(keys, testKey(i)...)
	}
	const readers, rounds = 4, 30 // each reader goes on until it has seen 30 rounds go by
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for g := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b Batch
			first := int64(-1)
			for {
				if err := c.GetMany(keys[g*32:], &b); err != nil {
					errs <- err
					return
				}
				var last int64
				for i := 0; i < b.Len(); i++ {
					if !b.Has(i) {
						errs <- fmt.Errorf("key %d missing", g+i)
						return
					}
					r, err := checkValue(keys[(g+i)*32:(g+i+1)*32], b.Value(i))
					if err != nil {
						errs <- err
						return
					}
					last = r
				}
				if first < 0 {
					first = last
				} else if last-first >= rounds {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st, err := c.Stats()
	if err != nil || st.ReaderHits < st.Hits || st.Hits == 0 || st.Readers < 1 {
		t.Fatalf("companion: %+v, %v: the Go reader's hits are not counted there", st, err)
	}
	_, pyHits := w.stop(t)
	if pyHits < st.Hits {
		t.Errorf("the Python reader's stats() sees %d reader hits; the Go reader made %d", pyHits, st.Hits)
	}
}

// A cache destroyed and created again under its name (a new creation id) is noticed and
// mapped again; while nothing is at the name, calls say the cache is not found.
func TestReattachAfterRecreate(t *testing.T) {
	name := fmt.Sprintf("go-recreate-%d", os.Getpid())
	w := startWriter(t, name, 10)
	c, err := Attach(name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first, _ := c.CreationID()
	w.stop(t)
	waitFor(t, "the destroyed cache to be seen gone", func() bool {
		_, _, err := c.Get(testKey(0))
		return errors.Is(err, ErrNotFound)
	})
	startWriter(t, name, 10)
	waitFor(t, "the re-created cache to be mapped", func() bool {
		id, err := c.CreationID()
		v, found, _ := c.Get(testKey(3))
		return err == nil && id != first && found && len(v) > 16
	})
}

// waitFor polls cond (every 10 ms) until it holds; the test fails after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A cache no supervisor fills is not ready, and says why; WaitReady gives up at its context.
func TestNotReadyWithoutASupervisor(t *testing.T) {
	name := fmt.Sprintf("go-status-%d", os.Getpid())
	startWriter(t, name, 10)
	c, err := Attach(name)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status()
	if err != nil || st.Ready || st.Why != "no live supervisor" {
		t.Fatalf("status %+v, %v", st, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.WaitReady(ctx); !errors.Is(err, ErrNotReady) || !strings.Contains(err.Error(), name) {
		t.Fatalf("WaitReady: %v", err)
	}
}
