package txmeta_test

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"testing"
)

// TestMain gives the examples their cache: golden/base.shm.gz at a name of this process
// (cacheName), mode 0600, removed with its companion when the tests end.
func TestMain(m *testing.M) {
	cacheName = fmt.Sprintf("go-txmeta-example-%d", os.Getpid())
	path := "/dev/shm/" + cacheName
	if err := install("../../golden/base.shm.gz", path); err != nil {
		fmt.Fprintln(os.Stderr, "the examples' cache:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.Remove(path)
	os.Remove("/dev/shm/.shmcache-" + cacheName + ".readers")
	os.Exit(code)
}

func install(golden, path string) error {
	f, err := os.Open(golden)
	if err != nil {
		return err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, z); err != nil {
		out.Close()
		os.Remove(path)
		return err
	}
	return out.Close()
}
