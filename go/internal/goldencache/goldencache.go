// Package goldencache puts a golden segment of the repository (golden/*.shm.gz, made by
// the Python writer) at a cache name under /dev/shm, for the examples and tests of this
// module: they then read a file the real writer made, with no writer of their own.
package goldencache

import (
	"compress/gzip"
	"io"
	"os"
)

// Install writes the gzip'd segment golden at /dev/shm/NAME, mode 0600 (the name must be
// free), and returns a function that removes it and its readers' companion.
func Install(golden, name string) (remove func(), err error) {
	path := "/dev/shm/" + name
	f, err := os.Open(golden)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if _, err := io.Copy(out, z); err != nil {
		out.Close()
		os.Remove(path)
		return nil, err
	}
	if err := out.Close(); err != nil {
		os.Remove(path)
		return nil, err
	}
	return func() {
		os.Remove(path)
		os.Remove("/dev/shm/.shmcache-" + name + ".readers")
	}, nil
}
