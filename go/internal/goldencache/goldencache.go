// Package goldencache puts a golden segment of the repository (golden/*.shm.gz, made by
// the Python writer) at a cache name under /dev/shm, for the examples and tests of this
// module: they then read a file the real writer made, with no writer of their own.
package goldencache

import (
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Install writes the gzip'd segment golden at /dev/shm/NAME, mode 0600 (the name must be
// free), and returns a function that removes it and its readers' companion.
func Install(golden, name string) (remove func(), err error) {
	data, err := gunzip(golden)
	if err != nil {
		return nil, err
	}
	path := "/dev/shm/" + name
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if _, err := out.Write(data); err != nil {
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

// gunzip reads the gzip'd file at path whole.
func gunzip(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(z)
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

// Control is a case of golden/control/expect.json: a golden control area
// (docs/segment-format.md, section 14), the words only a live process or the clock can make
// left for the test to fill, and the status every reader must give
// (tests/lib/shmtest/golden_control.py).
type Control struct {
	File   string             `json:"file"`
	Live   map[string]string  `json:"live"`   // file offset -> the role of a live process whose owner word goes there
	Locked []int64            `json:"locked"` // file offsets whose owner lock the test holds (section 13)
	Ages   map[string]float64 `json:"ages"`   // file offset -> seconds before now, on CLOCK_MONOTONIC
	Times  map[string]float64 `json:"times"`  // file offset -> seconds before now, a Kafka timestamp (unix ms)
	Status struct {
		Ready    bool                `json:"ready"`
		CaughtUp bool                `json:"caught_up"`
		Reason   string              `json:"reason"`
		Why      string              `json:"why"`
		BehindS  map[string]*float64 `json:"behind_s"` // by partition: at least this, within BehindSlackS; nil unknown
	} `json:"status"`
	Bounds []struct { // readiness bounds, and the why each gives ("" within it)
		MaxLag    *int64   `json:"max_lag"`
		MaxBehind *float64 `json:"max_behind"`
		Why       string   `json:"why"`
	} `json:"bounds"`
}

// BehindSlackS is how far past a golden's behind_s a reading may be (golden_control.BEHIND_SLACK_S).
const BehindSlackS = 60

// ControlCases reads the golden control areas' expectations from dir (the repository's
// golden/control).
func ControlCases(dir string) (map[string]Control, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "expect.json"))
	if err != nil {
		return nil, err
	}
	var doc struct {
		Cases map[string]Control `json:"cases"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "expect.json"), err)
	}
	return doc.Cases, nil
}

// Image is case c's control area, read from dir, with its live owner words (owners: role
// -> the owner word of a live process), ages and times filled as of now.
func (c Control) Image(dir string, owners map[string]int64) ([]byte, error) {
	data, err := gunzip(filepath.Join(dir, c.File))
	if err != nil {
		return nil, err
	}
	put := func(off string, v int64) {
		o, _ := strconv.Atoi(off)
		binary.LittleEndian.PutUint64(data[o:], uint64(v))
	}
	for off, role := range c.Live {
		put(off, owners[role])
	}
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	for off, s := range c.Ages {
		put(off, ts.Nano()-int64(s*1e9))
	}
	nowMS := time.Now().UnixMilli()
	for off, s := range c.Times {
		put(off, nowMS-int64(s*1000))
	}
	return data, nil
}

// Install puts case c's control area (Image) at /dev/shm/NAME, mode 0600, by a
// rename (a reader following the name sees it whole), and holds its owner locks; remove
// drops them and removes the file and its readers' companion.
func (c Control) Install(dir, name string, owners map[string]int64) (remove func(), err error) {
	data, err := c.Image(dir, owners)
	if err != nil {
		return nil, err
	}
	path := "/dev/shm/" + name
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return nil, err
	}
	release, err := HoldLocks(path, c.Locked)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return func() {
		release()
		os.Remove(path)
		os.Remove("/dev/shm/.shmcache-" + name + ".readers")
	}, nil
}
