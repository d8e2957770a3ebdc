//go:build amd64 && !shmcache_noprefetch

package shmcache

import "unsafe"

// Prefetches (PREFETCHT0, prefetch_amd64.s): hints that never fault and retire at once,
// so a batch keeps many cache misses in flight; a few per call, to keep calls few.

// prefetch2 asks for the cache lines of a and b.
//
//go:noescape
func prefetch2(a, b unsafe.Pointer)

// prefetchLines asks for every line of [p, p+n); n >= 1.
//
//go:noescape
func prefetchLines(p unsafe.Pointer, n int)

const havePrefetch = true
