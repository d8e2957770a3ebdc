package shmcache

import (
	"errors"
	"fmt"
)

// The kinds of error this package returns; test with errors.Is. Every error is an *Error
// whose message names the cache and what was wrong.
var (
	ErrNotFound   = errors.New("shmcache: cache not found")
	ErrNotACache  = errors.New("shmcache: not a shmcache segment")
	ErrCorrupt    = errors.New("shmcache: corrupt cache")
	ErrVersion    = errors.New("shmcache: unknown layout version")
	ErrNotReady   = errors.New("shmcache: cache not ready")
	ErrPermission = errors.New("shmcache: permission denied")
	ErrClosed     = errors.New("shmcache: handle closed")
	ErrKeySize    = errors.New("shmcache: wrong key size")
)

// Error is what every call returns on failure.
type Error struct {
	Cache  string // the cache's name (or the file's path, for AttachPath)
	Kind   error  // one of the Err* values
	Detail string // what was wrong
}

func (e *Error) Error() string { return fmt.Sprintf("cache '%s': %s", e.Cache, e.Detail) }
func (e *Error) Unwrap() error { return e.Kind }

func newErr(cache string, kind error, format string, args ...any) error {
	return &Error{Cache: cache, Kind: kind, Detail: fmt.Sprintf(format, args...)}
}
