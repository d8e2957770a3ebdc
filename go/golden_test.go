package shmcache

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// The golden segments (../golden, docs/segment-format.md section 12): the files and the
// answers every reader must give; the Python reader's tests run the same ones.

type goldenKey struct {
	Key     string  `json:"key"`
	Value   *string `json:"value"`
	Corrupt bool    `json:"corrupt"`
	Why     string  `json:"why"`
}

type goldenCase struct {
	File        string      `json:"file"`
	AttachError string      `json:"attach_error"`
	Field       *string     `json:"field"`
	Entries     *int64      `json:"entries"`
	Keys        []goldenKey `json:"keys"`
	LiveHolder  *int64      `json:"live_holder_offset"`
}

func goldenCases(t testing.TB) map[string]goldenCase {
	raw, err := os.ReadFile("../golden/expect.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Cases map[string]goldenCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Cases
}

func goldenBytes(t testing.TB, file string) []byte {
	f, err := os.Open(filepath.Join("../golden", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// writeGolden writes a golden segment (patched: file offset -> word) to a temporary file.
func writeGolden(t testing.TB, c goldenCase, patch map[int64]int64) string {
	data := goldenBytes(t, c.File)
	for off, w := range patch {
		binary.LittleEndian.PutUint64(data[off:], uint64(w))
	}
	path := filepath.Join(t.TempDir(), strings.TrimSuffix(c.File, ".gz"))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

var errKinds = map[string]error{"not_a_cache": ErrNotACache, "version": ErrVersion, "corrupt": ErrCorrupt}

func sortedNames(cases map[string]goldenCase) []string {
	names := make([]string, 0, len(cases))
	for n := range cases {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func TestGoldenHeadersAreRefusedByName(t *testing.T) {
	cases := goldenCases(t)
	n := 0
	for _, name := range sortedNames(cases) {
		c := cases[name]
		if c.AttachError == "" {
			continue
		}
		n++
		path := writeGolden(t, c, nil)
		_, err := AttachPath(path)
		if !errors.Is(err, errKinds[c.AttachError]) {
			t.Errorf("%s: got %v, want an error of kind %s", name, err, c.AttachError)
			continue
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v does not name the cache", name, err)
		}
		if c.Field != nil && !strings.Contains(err.Error(), "header field "+*c.Field+" is") {
			t.Errorf("%s: %v does not name the field %s", name, err, *c.Field)
		}
	}
	if n < 10 {
		t.Fatalf("only %d damaged headers in the goldens", n)
	}
}

func want(k goldenKey) []byte {
	if k.Value == nil {
		return nil
	}
	v, _ := hex.DecodeString(*k.Value)
	return v
}

func TestGoldenEveryKeyAnswersAsExpected(t *testing.T) {
	cases := goldenCases(t)
	for _, name := range sortedNames(cases) {
		c := cases[name]
		if c.AttachError != "" || name == "live_holder" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			r, err := AttachPath(writeGolden(t, c, nil))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if c.Entries != nil {
				if st, _ := r.Stats(); st.Entries != *c.Entries {
					t.Errorf("entries %d, want %d", st.Entries, *c.Entries)
				}
			}
			var flat []byte
			for _, k := range c.Keys {
				key, _ := hex.DecodeString(k.Key)
				flat = append(flat, key...)
				before, _ := r.Stats()
				got, found, err := r.Get(key)
				if err != nil {
					t.Fatal(err)
				}
				if found != (k.Value != nil) || !bytes.Equal(got, want(k)) {
					t.Errorf("%s: got %x (found %v), want %v", k.Why, got, found, k.Value)
				}
				after, _ := r.Stats()
				if (after.Corruptions > before.Corruptions) != k.Corrupt {
					t.Errorf("%s: corruption counted: %v, want %v", k.Why, after.Corruptions > before.Corruptions, k.Corrupt)
				}
			}
			var b Batch
			if err := r.GetMany(flat, &b); err != nil {
				t.Fatal(err)
			}
			for i, k := range c.Keys {
				if b.Has(i) != (k.Value != nil) || !bytes.Equal(b.Value(i), want(k)) {
					t.Errorf("batch: %s: got %x, want %v", k.Why, b.Value(i), k.Value)
				}
			}
			if err := r.ContainsMany(flat, &b); err != nil || len(b.Data) != 0 {
				t.Fatalf("contains: %v, %d value bytes copied", err, len(b.Data))
			}
			for i, k := range c.Keys {
				key, _ := hex.DecodeString(k.Key)
				one, err := r.Contains(key)
				if err != nil || one != (k.Value != nil) || b.Has(i) != one {
					t.Errorf("contains: %s: %v and %v, want %v (%v)", k.Why, one, b.Has(i), k.Value != nil, err)
				}
			}
		})
	}
}

func TestGoldenBucketHeldByALiveProcessIsGivenUpAfterTheBound(t *testing.T) {
	c := goldenCases(t)["live_holder"]
	r, err := AttachPath(writeGolden(t, c, map[int64]int64{*c.LiveHolder: OwnerWord(os.Getpid())}))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var held, other []byte
	nheld := 0
	for _, k := range c.Keys {
		key, _ := hex.DecodeString(k.Key)
		if k.Corrupt {
			held = append(held, key...)
			nheld++
		} else {
			other = append(other, key...)
		}
	}
	var b Batch
	t0 := time.Now()
	if err := r.GetMany(held, &b); err != nil {
		t.Fatal(err)
	}
	took := time.Since(t0)
	if b.Hits() != 0 || b.Corruptions != int64(nheld) {
		t.Errorf("held bucket: %d hits, %d corruptions; want 0 and %d", b.Hits(), b.Corruptions, nheld)
	}
	if took < time.Second || took > 3*time.Second {
		t.Errorf("gave up after %v; the bound is 1 s for the whole batch", took)
	}
	if err := r.GetMany(other, &b); err != nil || b.Corruptions != 0 {
		t.Errorf("the other buckets: %v, %d corruptions", err, b.Corruptions)
	}
}
