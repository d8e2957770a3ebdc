// Package testpython finds, for the Go tests, the Python that writes the caches they read:
// the repo's virtualenv (scripts/setup makes it), or $SHMCACHE_PYTHON. A test that needs it
// skips, saying so, where it is not there.
package testpython

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// Path is the interpreter with shmcache installed; the test skips without one.
func Path(t testing.TB) string {
	p := os.Getenv("SHMCACHE_PYTHON")
	if p == "" {
		_, here, _, _ := runtime.Caller(0) // go/internal/testpython/testpython.go
		p = filepath.Join(filepath.Dir(here), "..", "..", "..", ".venv", "bin", "python")
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no Python with shmcache at %s (run scripts/setup, or set SHMCACHE_PYTHON)", p)
	}
	return p
}

// WithHelpers is Path when that Python can import the test helpers (shmtest, which
// scripts/setup installs with the rest); the test skips, saying so, otherwise.
func WithHelpers(t testing.TB) string {
	p := Path(t)
	ok, seen := importable.Load(p)
	if !seen {
		ok = exec.Command(p, "-c", "import shmtest").Run() == nil
		importable.Store(p, ok)
	}
	if !ok.(bool) {
		t.Skipf("%s cannot import the test helpers, shmtest (run scripts/setup)", p)
	}
	return p
}

var importable sync.Map // interpreter -> whether it imports shmtest
