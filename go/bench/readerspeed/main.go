// Command readerspeed times GetMany of one process, for readerspeed/compare.py: it
// attaches cache NAME, looks up one batch to grow its Batch, then BATCHES batches of 1024
// keys from KEYS (32-byte keys back to back, taken in order and round again), and prints
// "KEYS_PER_WALL_S KEYS_PER_CPU_S HITS": the keys over the wall time and over the CPU time
// of the thread that ran them (getrusage RUSAGE_THREAD: what other processes take of the
// core is left out).
//
//	readerspeed NAME KEYS BATCHES
//
// It uses the reader's API only, so it builds against any revision of the reader
// (compare.py --before).
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"

	shmcache "github.com/shmcache/shmcache/go"
)

const batch = 1024

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "readerspeed: "+format+"\n", args...)
	os.Exit(2)
}

// threadCPU is the CPU time of the calling thread, in seconds.
func threadCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1, &ru); err != nil { // 1: RUSAGE_THREAD
		fail("getrusage: %v", err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func main() {
	if len(os.Args) != 4 {
		fail("usage: readerspeed NAME KEYS BATCHES")
	}
	keys, err := os.ReadFile(os.Args[2])
	if err != nil {
		fail("%v", err)
	}
	batches, err := strconv.Atoi(os.Args[3])
	if err != nil || batches < 1 || len(keys) < batch*32 {
		fail("BATCHES %q: a positive number, and KEYS at least %d keys", os.Args[3], batch)
	}
	c, err := shmcache.Attach(os.Args[1])
	if err != nil {
		fail("%v", err)
	}
	defer c.Close()
	runtime.LockOSThread() // the thread whose CPU time is read
	var b shmcache.Batch
	n, pos, hits := len(keys)/32, 0, 0
	run := func(count int) {
		for range count {
			if pos+batch > n {
				pos = 0
			}
			if err := c.GetMany(keys[pos*32:(pos+batch)*32], &b); err != nil {
				fail("%v", err)
			}
			hits += b.Hits()
			pos += batch
		}
	}
	run(1)
	hits = 0
	t0, c0 := time.Now(), threadCPU()
	run(batches)
	wall, cpu := time.Since(t0).Seconds(), threadCPU()-c0
	keysDone := float64(batches * batch)
	fmt.Printf("%.0f %.0f %d\n", keysDone/wall, keysDone/cpu, hits)
}
