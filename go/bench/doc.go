// Package bench measures the Go reader against its peers, in a module of its own so that
// the peers (VictoriaMetrics/fastcache, and what it pulls in) are never a dependency of
// a program that imports the reader: github.com/shmcache/shmcache/go requires only
// xxhash and x/sys. It reads the reader of this checkout (a replace to ../).
//
//	go test -run '^$' -bench . -benchmem -cpu 1                  GetMany, get_many_packed and fastcache's Get
//	.venv/bin/python go/bench/readerspeed/compare.py [--before REV]   GetMany against get_many_packed, in turn
//	teranodebench                                                the Go side of bench/test_teranode.py
//
// The caches are filled by a Python writer (testdata/bench.py, the repository's
// virtualenv); without it the benchmarks skip, saying so.
package bench
