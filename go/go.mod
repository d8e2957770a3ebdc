module github.com/shmcache/shmcache/go

go 1.23.12

require (
	github.com/VictoriaMetrics/fastcache v1.12.2
	github.com/cespare/xxhash/v2 v2.3.0
	golang.org/x/sys v0.30.0
)

require github.com/golang/snappy v0.0.4 // indirect
