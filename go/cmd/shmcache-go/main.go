// Command shmcache-go reads a shmcache cache with the Go reader, for operators and for
// checking one reader against another:
//
//	shmcache-go get NAME HEXKEY...   one line per key: the value in hex, or - for a miss
//	shmcache-go stats NAME           the stats as JSON (the Python reader's names)
//	shmcache-go status NAME          readiness as JSON
//
// A bad argument or a missing cache: one line on stderr and exit status 2.
package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"

	shmcache "github.com/shmcache/shmcache/go"
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "shmcache-go: "+format+"\n", args...)
	os.Exit(2)
}

func main() {
	args := os.Args[1:]
	if len(args) < 2 || (args[0] == "get" && len(args) < 3) || (args[0] != "get" && len(args) != 2) {
		fail("usage: shmcache-go get NAME HEXKEY... | stats NAME | status NAME")
	}
	cmd, name := args[0], args[1]
	if cmd != "get" && cmd != "stats" && cmd != "status" {
		fail("unknown command %q (get, stats, status)", cmd)
	}
	c, err := shmcache.Attach(name)
	if err != nil {
		fail("%v", err)
	}
	defer c.Close()
	switch cmd {
	case "get":
		geo, _ := c.Geometry()
		var keys []byte
		for _, h := range args[2:] {
			k, err := hex.DecodeString(h)
			if err != nil || int64(len(k)) != geo.KeySize {
				fail("key %q is not %d bytes of hex", h, geo.KeySize)
			}
			keys = append(keys, k...)
		}
		var b shmcache.Batch
		if err := c.GetMany(keys, &b); err != nil {
			fail("%v", err)
		}
		for i := 0; i < b.Len(); i++ {
			if b.Has(i) {
				fmt.Println(hex.EncodeToString(b.Value(i)))
			} else {
				fmt.Println("-")
			}
		}
	case "stats", "status":
		var v any
		if cmd == "stats" {
			v, err = c.Stats()
		} else {
			v, err = c.Status()
		}
		if err != nil {
			fail("%v", err)
		}
		out, _ := json.MarshalIndent(v, "", "  ")
		fmt.Println(string(out))
	}
}
