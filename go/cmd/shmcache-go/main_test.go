package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The tests run this test binary as the command (SHMCACHE_GO_MAIN=1 makes it main()).
func TestMain(m *testing.M) {
	if os.Getenv("SHMCACHE_GO_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func run(t *testing.T, args ...string) (string, string, int) {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "SHMCACHE_GO_MAIN=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if e, ok := err.(*exec.ExitError); ok {
		code = e.ExitCode()
	}
	return out.String(), errb.String(), code
}

// installGolden copies the base golden segment to /dev/shm under a unique name (removed
// after the test) and returns the name and the expected answers.
func installGolden(t *testing.T) (string, []struct {
	Key   string  `json:"key"`
	Value *string `json:"value"`
}) {
	f, err := os.Open("../../../golden/base.shm.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, _ := gzip.NewReader(f)
	data, _ := io.ReadAll(z)
	name := fmt.Sprintf("go-cmd-%d", os.Getpid())
	if err := os.WriteFile("/dev/shm/"+name, data, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove("/dev/shm/" + name) })
	raw, _ := os.ReadFile("../../../golden/expect.json")
	var doc struct {
		Cases map[string]struct {
			Keys []struct {
				Key   string  `json:"key"`
				Value *string `json:"value"`
			} `json:"keys"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return name, doc.Cases["base"].Keys
}

func TestGetAnswersEveryGoldenKeyByName(t *testing.T) {
	name, keys := installGolden(t)
	args := []string{"get", name}
	var want []string
	for _, k := range keys {
		args = append(args, k.Key)
		if k.Value == nil {
			want = append(want, "-")
		} else {
			want = append(want, *k.Value)
		}
	}
	out, errs, code := run(t, args...)
	if code != 0 || strings.Join(want, "\n")+"\n" != out {
		t.Fatalf("exit %d, stderr %q; got\n%s\nwant\n%s", code, errs, out, strings.Join(want, "\n"))
	}
	out, _, code = run(t, "stats", name)
	if code != 0 || !strings.Contains(out, `"entries": 19`) {
		t.Fatalf("stats: exit %d\n%s", code, out)
	}
	out, _, code = run(t, "status", name)
	if code != 0 || !strings.Contains(out, `"why": "no live supervisor"`) {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
}

func TestMistakesAreOneLineAndExitStatus2(t *testing.T) {
	name, _ := installGolden(t)
	for _, args := range [][]string{{}, {"get", name}, {"frob", name}, {"get", name, "zz"}, {"get", name, "00"},
		{"stats", "no-such-cache-" + name}, {"get", "../etc/passwd", "00"}} {
		out, errs, code := run(t, args...)
		if code != 2 || out != "" || strings.Count(errs, "\n") != 1 || !strings.HasPrefix(errs, "shmcache-go: ") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
}
