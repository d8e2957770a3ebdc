package shmcache

// Owner words (docs/segment-format.md, section 13): pid << 32 | stamp, stamp = the low
// 32 bits of the process's start time in 1/100 s since the epoch, as the Python engine
// (psutil) computes it: round((starttime / CLK_TCK + btime) * 100), 1 if that is 0.

import (
	"bytes"
	"errors"
	"io/fs"
	"math"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const clkTck = 100 // sysconf(_SC_CLK_TCK): 100 on every Linux this runs on

var bootTime = sync.OnceValue(func() float64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(raw, []byte("\n")) {
		if f := bytes.Fields(line); len(f) == 2 && string(f[0]) == "btime" {
			v, _ := strconv.ParseFloat(string(f[1]), 64)
			return v
		}
	}
	return 0
})

// procStat is the state letter and start time (clock ticks since boot) of a process;
// err wraps fs.ErrNotExist when there is none.
func procStat(pid int) (state byte, start uint64, err error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, 0, fs.ErrNotExist
	}
	f := bytes.Fields(raw[i+1:]) // f[0] is field 3 (state); starttime is field 22
	if len(f) < 20 {
		return 0, 0, fs.ErrNotExist
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	return f[0][0], start, err
}

func stampOf(start uint64) int64 {
	t := float64(float64(start)/clkTck) + bootTime()
	s := int64(math.RoundToEven(float64(t*100))) & 0xFFFFFFFF
	if s == 0 {
		s = 1
	}
	return s
}

// OwnerWord is the owner word of process pid (0 if it cannot be read).
func OwnerWord(pid int) int64 {
	_, start, err := procStat(pid)
	if err != nil {
		return 0
	}
	return int64(pid)<<32 | stampOf(start)
}

var myOwnerWord = sync.OnceValue(func() int64 { return OwnerWord(os.Getpid()) })

// IsAlive says whether the process an owner word names is running: not gone, not a
// zombie, not another process with its pid. One this process may not look at is alive.
func IsAlive(w int64) bool {
	pid := int(w >> 32)
	if pid <= 0 {
		return false
	}
	state, start, err := procStat(pid)
	if err != nil {
		// gone (or exiting: ESRCH) or unreadable garbage is dead; a permission error is alive
		return !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ESRCH) && !errors.Is(err, strconv.ErrSyntax)
	}
	return state != 'Z' && stampOf(start) == w&0xFFFFFFFF
}

// Owner locks (section 13): the owner of a word holds an open-file-description write lock
// on the word's 8 bytes of the file; the kernel drops it when the owner dies, and every
// process that opens the file sees it, whatever PID namespace either runs in.

// ownerLocked says whether some open file description other than fd's holds a write lock
// on word index of the file fd holds open (read locks, a JVM reader's passing test, are
// no owners). ok is false when the kernel cannot say (no OFD locks: before Linux 3.15).
func ownerLocked(fd int, index int64) (held, ok bool) {
	lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: 0, Start: index * word, Len: word}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk); err != nil {
		return false, false
	}
	return lk.Type != unix.F_UNLCK, true
}

// lockOwner takes the owner lock of word index on fd (open for writing); false if another
// owner holds it. A read lock met there (a JVM reader's test) is waited out.
func lockOwner(fd int, index int64) bool {
	deadline := time.Now().Add(probeWait)
	for {
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: index * word, Len: word}
		err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk)
		if err == nil {
			return true
		}
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
			return false
		}
		if held, _ := ownerLocked(fd, index); held || time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

// probeWait is the longest a claimant waits out readers' passing read locks on a word.
const probeWait = time.Second

// judge tells the living among the owner words of one file, open on fd: by owner lock
// when locks (a segment with H_OWNER_LOCKS set, a companion of version companionLocks or
// later), else by the pid rule (IsAlive).
type judge struct {
	fd    int
	locks bool
}

// alive says whether the process owner word w, published at word index of the file, runs.
// This process's own word is alive (a lock it holds on fd cannot be seen through fd).
func (j judge) alive(w int64, index int64) bool {
	if w == 0 {
		return false
	}
	if !j.locks {
		return IsAlive(w)
	}
	if w == myOwnerWord() {
		return true
	}
	held, ok := ownerLocked(j.fd, index)
	if !ok {
		return IsAlive(w)
	}
	return held
}

// unlockOwner drops the owner lock of word index that fd holds (none: nothing happens).
func unlockOwner(fd int, index int64) {
	lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: 0, Start: index * word, Len: word}
	_ = unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk)
}
