package shmcache

// A file cut short while it is mapped (its owner may truncate it) faults with SIGBUS at
// the next touch of the lost pages. Every read of a mapping runs with
// runtime/debug.SetPanicOnFault on, which turns that fault into a panic of this
// goroutine; the deferred recover below turns the panic into the handle's "cut short"
// error, so the process never dies of it. A panic that is not a fault is re-raised.

import "runtime/debug"

// addrError is what the runtime panics with on a memory fault under SetPanicOnFault.
type addrError interface{ Addr() uintptr }

// guard is deferred by every call that reads a mapping, with the SetPanicOnFault value it
// replaced; on a fault it marks s lost and sets *err.
func guard(old bool, s *segment, cache, path string, err *error) {
	debug.SetPanicOnFault(old)
	if r := recover(); r != nil {
		if _, ok := r.(addrError); !ok {
			panic(r)
		}
		if s != nil {
			s.lost.Store(true)
		}
		*err = lostErr(cache, path)
	}
}

// protect runs fn with faults turned into errors (for calls off the hot path).
func protect(fn func() error) (err error) {
	defer guard(debug.SetPanicOnFault(true), nil, "", "", &err)
	return fn()
}
