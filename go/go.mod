module github.com/shmcache/shmcache/go

go 1.23

require (
	github.com/cespare/xxhash/v2 v2.3.0
	golang.org/x/sys v0.30.0
)
