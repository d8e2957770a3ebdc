//go:build !amd64 || shmcache_noprefetch

package shmcache

import "unsafe"

// No prefetch instruction here: a batch touches its lines instead (lookup.go, touch*).

func prefetch2(a, b unsafe.Pointer)         {}
func prefetchLines(p unsafe.Pointer, n int) {}

const havePrefetch = false
