//go:build !amd64

package shmcache

import "sync/atomic"

// loadFence orders the loads before it ahead of the loads after it: the seqlock's plain
// reads of a bucket must be done before its version is loaded again, and an acquire load
// (arm64's LDAR) does not keep earlier loads from passing it. An atomic read-modify-write
// (arm64: LDADDAL, acquire and release) does; p is a word of the caller's own.
func loadFence(p *int64) { atomic.AddInt64(p, 0) }
