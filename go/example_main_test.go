package shmcache_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/shmcache/shmcache/go/internal/goldencache"
)

// TestMain gives the examples their cache: golden/base.shm.gz at a name of this process
// (cacheName), removed with its companion when the tests end.
func TestMain(m *testing.M) {
	cacheName = fmt.Sprintf("go-example-%d", os.Getpid())
	remove, err := goldencache.Install("../golden/base.shm.gz", cacheName)
	if err != nil {
		fmt.Fprintln(os.Stderr, "the examples' cache:", err)
		os.Exit(1)
	}
	code := m.Run()
	remove()
	os.Exit(code)
}
