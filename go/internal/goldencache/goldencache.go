// Package goldencache puts a golden segment of the repository (golden/*.shm.gz, made by
// the Python writer) at a cache name under /dev/shm, for the examples and tests of this
// module: they then read a file the real writer made, with no writer of their own.
package goldencache

import (
	"compress/gzip"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
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

// HoldLocks takes the owner locks (docs/segment-format.md, section 13) of the words at
// these byte offsets of the file at path, as the processes those words name would hold
// them, on a file description of its own; release drops them. A golden control area's
// live words are alive by these locks, in whatever PID namespace their pids belong to.
func HoldLocks(path string, offsets []int64) (release func(), err error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	for _, off := range offsets {
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: off, Len: 8}
		if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("owner lock of the word at %d of %s: %w", off, path, err)
		}
	}
	return func() { unix.Close(fd) }, nil
}
