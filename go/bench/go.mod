module github.com/shmcache/shmcache/go/bench

go 1.23

require (
	github.com/VictoriaMetrics/fastcache v1.12.2
	github.com/shmcache/shmcache/go v0.0.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/golang/snappy v0.0.4 // indirect
	golang.org/x/sys v0.30.0 // indirect
)

// the reader of this checkout, not a tagged release: the peers are measured against it
replace github.com/shmcache/shmcache/go => ../
