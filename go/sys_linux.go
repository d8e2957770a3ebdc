package shmcache

// The platform part: every system call the package makes is in this file and
// liveness_linux.go (opening without following or blocking, mapping, the clocks).

import (
	"errors"
	"unsafe"

	"golang.org/x/sys/unix"
)

const shmDir = "/dev/shm"

// fileInfo is what fstat of an open file says that a reader checks.
type fileInfo struct {
	size   int64
	blocks int64  // 512-byte blocks allocated
	uid    uint32 // owner
	mode   uint32 // permission bits
	ident  identity
}

// whole says every byte of the file is allocated (st_blocks * 512 >= st_size): only such a
// file is populated at mapping (docs/segment-format.md, section 1, "Populate").
func (f fileInfo) whole() bool { return f.blocks*512 >= f.size }

// openRegular opens path the way a directory every user may write needs: never following
// a symlink, never blocking on a FIFO, and keeping only a regular file. It returns the fd
// and what fstat of it says.
func openRegular(cache, path string, write bool) (int, fileInfo, error) {
	flags := unix.O_RDONLY
	if write {
		flags = unix.O_RDWR
	}
	fd, err := unix.Open(path, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		switch {
		case errors.Is(err, unix.ENOENT):
			return -1, fileInfo{}, newErr(cache, ErrNotFound, "does not exist (no %s)", path)
		case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
			return -1, fileInfo{}, newErr(cache, ErrPermission, "permission denied opening %s", path)
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENXIO),
			errors.Is(err, unix.ENODEV), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EOPNOTSUPP):
			return -1, fileInfo{}, newErr(cache, ErrNotACache, "%s is %s, not a shmcache segment (a cache is a "+
				"regular file)", path, kindAt(path))
		}
		return -1, fileInfo{}, newErr(cache, ErrNotFound, "cannot open %s: %v", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fileInfo{}, newErr(cache, ErrNotFound, "cannot stat %s: %v", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, fileInfo{}, newErr(cache, ErrNotACache, "%s is %s, not a shmcache segment (a cache is a regular "+
			"file)", path, kindOf(st.Mode))
	}
	return fd, fileInfo{size: st.Size, blocks: st.Blocks, uid: st.Uid, mode: st.Mode & 0o7777,
		ident: identity{uint64(st.Dev), st.Ino, st.Mode&unsafeModeBits != 0}}, nil
}

func kindAt(path string) string {
	var st unix.Stat_t
	if unix.Lstat(path, &st) != nil {
		return "not a regular file"
	}
	return kindOf(st.Mode)
}

func kindOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFLNK:
		return "a symbolic link"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFREG:
		return "a regular file"
	}
	return "not a regular file"
}

// identity is (device, inode) of what is at path now, without following a symlink, and
// whether its mode lets its group or others write it (a chmod of the very file mapped is a
// change a following handle acts on: it attaches again, and the mode check refuses it); ok
// false if nothing is there.
type identity struct {
	dev, ino   uint64
	unsafeMode bool
}

func identityAt(path string) (identity, bool) {
	var st unix.Stat_t
	if unix.Lstat(path, &st) != nil {
		return identity{}, false
	}
	return identity{uint64(st.Dev), st.Ino, st.Mode&unsafeModeBits != 0}, true
}

func pread(fd int, n int) []byte {
	buf := make([]byte, n)
	got, err := unix.Pread(fd, buf, 0)
	if err != nil || got < 0 {
		return nil
	}
	return buf[:got]
}

const hugePage = 2 << 20

// mapFile maps the whole file, shared, read-only unless write, at a 2 MiB-aligned
// address (as the Python engine does: a creator asks for 2 MiB pages, and only an
// aligned mapping gets 2 MiB page table entries, sparing a TLB miss per lookup). With
// populate the page tables are filled at once (MAP_POPULATE): only for a file wholly
// allocated, since on tmpfs populating a hole allocates it.
func mapFile(fd int, size int64, write, populate bool) ([]byte, error) {
	prot := unix.PROT_READ
	if write {
		prot |= unix.PROT_WRITE
	}
	n := uintptr(size)
	base, err := unix.MmapPtr(-1, 0, nil, n+hugePage, unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE) // address space to align in
	if err != nil {
		return nil, err
	}
	head := (hugePage - uintptr(base)%hugePage) % hugePage
	addr := unsafe.Add(base, head)
	flags := unix.MAP_SHARED | unix.MAP_FIXED
	if populate {
		flags |= unix.MAP_POPULATE
	}
	got, err := unix.MmapPtr(fd, 0, addr, n, prot, flags)
	if err != nil || got != addr {
		_ = unix.MunmapPtr(base, n+hugePage)
		if err == nil {
			err = unix.EINVAL
		}
		return nil, err
	}
	if head > 0 {
		_ = unix.MunmapPtr(base, head)
	}
	if tail := hugePage - head; tail > 0 {
		_ = unix.MunmapPtr(unsafe.Add(addr, n), tail)
	}
	return unsafe.Slice((*byte)(addr), n), nil
}

func unmap(b []byte) {
	if len(b) > 0 {
		_ = unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)))
	}
}

// words views n int64 words of a mapping from byte offset off (8-aligned: mappings are).
func words(b []byte, off, n int64) []int64 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*int64)(unsafe.Pointer(&b[off])), n)
}

func monotonicNS() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func wallNS() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_REALTIME, &ts)
	return ts.Nano()
}

func closeFile(fd int) error { return unix.Close(fd) }
