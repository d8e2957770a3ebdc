package txmeta

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"testing"
)

// goldenCase is one case of golden/txmeta/cases.json (tests/lib/shmtest/golden_txmeta.py).
type goldenCase struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Expect struct {
		Valid       *bool      `json:"valid"` // present (false) only for a malformed value
		Fee         uint64     `json:"fee"`
		Size        uint64     `json:"size"`
		Flags       uint8      `json:"flags"`
		Parents     []string   `json:"parents"`
		ParentVouts [][]uint32 `json:"parent_vouts"`
		BlockHeight *uint32    `json:"block_height"`
	} `json:"expect"`
	value []byte
}

func (c *goldenCase) valid() bool { return c.Expect.Valid == nil }

const goldenPath = "../../golden/txmeta/cases.json"

func goldenCases(t testing.TB) []goldenCase {
	raw, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	var f struct{ Cases []goldenCase }
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	for i := range f.Cases {
		if f.Cases[i].value, err = hex.DecodeString(f.Cases[i].Value); err != nil {
			t.Fatal(err)
		}
	}
	return f.Cases
}

// sameAsExpected says how m differs from a valid case's expected decode ("" if it does not).
func sameAsExpected(c *goldenCase, m *Meta) string {
	e := &c.Expect
	parents := make([]string, len(m.Parents))
	for i, p := range m.Parents {
		parents[i] = hex.EncodeToString(p[:])
	}
	vouts := make([][]uint32, len(m.ParentVouts))
	for i, vs := range m.ParentVouts {
		vouts[i] = append([]uint32{}, vs...)
	}
	wantParents, wantVouts := e.Parents, e.ParentVouts
	if wantParents == nil {
		wantParents = []string{}
	}
	if wantVouts == nil {
		wantVouts = [][]uint32{}
	}
	for i := range wantVouts {
		if wantVouts[i] == nil {
			wantVouts[i] = []uint32{}
		}
	}
	switch {
	case m.Fee != e.Fee || m.Size != e.Size || m.Flags != e.Flags:
		return "fee, size or flags"
	case !reflect.DeepEqual(parents, wantParents):
		return "parents"
	case !reflect.DeepEqual(vouts, wantVouts):
		return "parent_vouts"
	case m.HasHeight != (e.BlockHeight != nil) || (m.HasHeight && m.BlockHeight != *e.BlockHeight):
		return "block_height"
	case m.IsCoinbase() != (e.Flags&FlagCoinbase != 0):
		return "IsCoinbase"
	}
	return ""
}

// Every golden value decodes as expected: into a fresh Meta, and into one Meta reused
// across all of them (a smaller value after a bigger one leaves nothing of it behind).
func TestGoldenValues(t *testing.T) {
	cases := goldenCases(t)
	var reused Meta
	malformed := 0
	for i := range cases {
		c := &cases[i]
		for _, m := range []*Meta{new(Meta), &reused} {
			err := m.Decode(c.value)
			if !c.valid() {
				malformed++
				var me *MalformedError
				if !errors.Is(err, ErrMalformed) || !errors.As(err, &me) || me.Len != len(c.value) {
					t.Errorf("%s: want a malformed value, got %v", c.Name, err)
				}
				if !reflect.DeepEqual(*m, Meta{Parents: m.Parents[:0], ParentVouts: m.ParentVouts[:0], vouts: m.vouts[:0]}) {
					t.Errorf("%s: a malformed value left fields in the Meta: %+v", c.Name, m)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s: %v", c.Name, err)
			} else if diff := sameAsExpected(c, m); diff != "" {
				t.Errorf("%s: %s differ from the golden decode", c.Name, diff)
			}
		}
		h, ok := Height(c.value)
		if want := c.valid() && c.Expect.BlockHeight != nil; ok != want || (ok && h != *c.Expect.BlockHeight) {
			t.Errorf("%s: Height says %d, %v", c.Name, h, ok)
		}
	}
	if malformed/2 < 400 {
		t.Fatalf("only %d malformed golden values", malformed/2)
	}
}

// Decoding allocates nothing once a Meta's buffers have grown to the largest value.
func TestDecodeAllocatesNothing(t *testing.T) {
	cases := goldenCases(t)
	var m Meta
	for i := range cases {
		_ = m.Decode(cases[i].value)
	}
	allocs := testing.AllocsPerRun(20, func() {
		for i := range cases {
			if cases[i].valid() {
				_ = m.Decode(cases[i].value)
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations decoding the valid golden values again", allocs)
	}
}

// encode writes m back in the layout (for the fuzz test's round trip).
func encode(m *Meta) []byte {
	b := binary.LittleEndian.AppendUint64(nil, m.Fee)
	b = binary.LittleEndian.AppendUint64(b, m.Size)
	b = append(b, m.Flags)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Parents)))
	for _, p := range m.Parents {
		b = append(b, p[:]...)
	}
	for _, vs := range m.ParentVouts {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(vs)))
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint32(b, v)
		}
	}
	if m.HasHeight {
		b = binary.BigEndian.AppendUint32(b, m.BlockHeight)
	}
	return b
}

// Whatever the bytes: no panic, and a value that decodes is exactly its fields' encoding.
// `go test` runs the golden values as the seed corpus; `go test -fuzz Decode` explores.
func FuzzDecode(f *testing.F) {
	for _, c := range goldenCases(f) {
		f.Add(c.value)
	}
	var m Meta
	f.Fuzz(func(t *testing.T, v []byte) {
		if err := m.Decode(v); err != nil {
			return
		}
		if back := encode(&m); !bytes.Equal(back, v) {
			t.Fatalf("%x decoded to %+v, which encodes to %x", v, m, back)
		}
	})
}

// A Meta's JSON is the object every reader's `get --decode txmeta` prints, which each
// golden case's expect holds: equal as parsed JSON (numbers kept as written), with empty
// lists as [], for a fresh Meta and for one reused across every value.
func TestMarshalJSONIsTheGoldenObject(t *testing.T) {
	raw, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	parse := func(b []byte) any {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		return v
	}
	var f struct {
		Cases []struct{ Expect json.RawMessage }
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	cases := goldenCases(t)
	var reused Meta
	for i := range cases {
		if !cases[i].valid() {
			continue
		}
		for _, m := range []*Meta{new(Meta), &reused} {
			if err := m.Decode(cases[i].value); err != nil {
				t.Fatalf("%s: %v", cases[i].Name, err)
			}
			got, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if want := f.Cases[i].Expect; !reflect.DeepEqual(parse(got), parse(want)) {
				t.Errorf("%s: %s, want %s", cases[i].Name, got, want)
			}
		}
	}
}

// TestMinSizeIsTheSmallestValueThatDecodes: a value of MinSize bytes (no parents, no height)
// decodes, and one byte less is malformed, so a caller that checks a length against MinSize
// refuses nothing Decode takes.
func TestMinSizeIsTheSmallestValueThatDecodes(t *testing.T) {
	v := make([]byte, MinSize)
	binary.LittleEndian.PutUint64(v, 1234)
	binary.LittleEndian.PutUint64(v[8:], 250)
	var m Meta
	if err := m.Decode(v); err != nil {
		t.Fatalf("a value of MinSize (%d) bytes: %v", MinSize, err)
	}
	if m.Fee != 1234 || m.Size != 250 || len(m.Parents) != 0 || m.HasHeight {
		t.Fatalf("decoded %+v", m)
	}
	if err := m.Decode(v[:MinSize-1]); err == nil {
		t.Fatalf("a value of %d bytes decoded", MinSize-1)
	}
}
