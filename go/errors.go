package shmcache

import (
	"errors"
	"fmt"
	"io/fs"
)

// kind is one kind of error: its text, its word in the readers' contract
// (docs/reader-contract.md, "Errors") and the more general error it is also, if any.
type kind struct {
	text string
	word string
	also error // errors.Is(err, also) holds for an error of this kind (nil: none)
}

func (k *kind) Error() string { return k.text }
func (k *kind) Unwrap() error { return k.also }

// The kinds of error this package returns; test with errors.Is. Every error is an *Error
// whose message names the cache and what was wrong; Kind gives its word.
var (
	ErrNotFound    error = &kind{"shmcache: cache not found", "not-found", fs.ErrNotExist}
	ErrNotACache   error = &kind{"shmcache: not a shmcache segment", "not-a-cache", nil}
	ErrCorrupt     error = &kind{"shmcache: corrupt cache", "corrupt", nil}
	ErrVersion     error = &kind{"shmcache: unknown layout version", "unknown-version", nil}
	ErrPermission  error = &kind{"shmcache: permission denied", "permission", fs.ErrPermission}
	ErrWrongOwner  error = &kind{"shmcache: the cache belongs to another user", "wrong-owner", ErrPermission}
	ErrUnsafeMode  error = &kind{"shmcache: the cache's file may be written by others", "unsafe-mode", ErrPermission}
	ErrBadArgument error = &kind{"shmcache: bad argument", "bad-argument", nil}
	ErrKeySize     error = &kind{"shmcache: wrong key size", "bad-argument", ErrBadArgument}
	ErrClosed      error = &kind{"shmcache: handle closed", "bad-argument", ErrBadArgument}
	ErrNotReady    error = &kind{"shmcache: cache not ready", "not-ready", nil}
)

// Error is what every call returns on failure.
type Error struct {
	Cache  string // the cache's name (or the file's path, for AttachPath)
	Kind   error  // one of the Err* values
	Detail string // what was wrong
	Err    error  // what caused it, if anything (WaitReady: the context's error)
}

func (e *Error) Error() string { return fmt.Sprintf("cache '%s': %s", e.Cache, e.Detail) }
func (e *Error) Unwrap() error { return e.Kind }

// Is says whether the error's cause is target: a WaitReady error is ErrNotReady and
// context.DeadlineExceeded (or context.Canceled) at once.
func (e *Error) Is(target error) bool { return e.Err != nil && errors.Is(e.Err, target) }

// Kind is the word [the readers' contract] gives err: not-found, not-a-cache, corrupt,
// unknown-version, wrong-owner, unsafe-mode, permission, bad-argument or not-ready, the
// same word every reader (and its command) gives for the same case; "" for an error that
// is none of this package's.
//
// [the readers' contract]: https://github.com/shmcache/shmcache/blob/main/docs/reader-contract.md#errors
func Kind(err error) string {
	var k *kind
	if errors.As(err, &k) {
		return k.word
	}
	return ""
}

func newErr(cache string, kind error, format string, args ...any) error {
	return &Error{Cache: cache, Kind: kind, Detail: fmt.Sprintf(format, args...)}
}
