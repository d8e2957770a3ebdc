package shmcache

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Whatever else sits at a cache's name in /dev/shm (a FIFO, a directory, a symlink to a
// real cache, a file too short) is refused by name, without blocking or following it.
func TestStrangersAtTheNameAreRefused(t *testing.T) {
	base := fmt.Sprintf("go-stranger-%d", os.Getpid())
	golden := writeGolden(t, goldenCases(t)["base"], nil)
	makers := map[string]func(string) error{
		"a FIFO":          func(p string) error { return unix.Mkfifo(p, 0o600) },
		"a directory":     func(p string) error { return os.Mkdir(p, 0o700) },
		"a symbolic link": func(p string) error { return os.Symlink(golden, p) },
		"100 bytes":       func(p string) error { return os.WriteFile(p, make([]byte, 100), 0o600) },
	}
	for what, mk := range makers {
		name := base + "-" + strings.ReplaceAll(what, " ", "-")
		path := shmDir + "/" + name
		if err := mk(path); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(path) })
		_, err := Attach(name)
		if !errors.Is(err, ErrNotACache) || !strings.Contains(err.Error(), name) ||
			(what != "100 bytes" && !strings.Contains(err.Error(), what)) {
			t.Errorf("%s: %v", what, err)
		}
	}
	if _, err := Attach("no-such-" + base); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing: %v", err)
	}
	if _, err := Attach("../etc/passwd"); !errors.Is(err, ErrBadArgument) {
		t.Errorf("a path for a name: %v", err)
	}
}
