package txmeta

// The txmeta value: Teranode's MetaBytes, as its txmeta topic carries it and the cache
// holds it. The reference is the Python decoder (formats/txmeta.py); its checks, in its
// order, are these:
//
//	+------------+-------------+----------+-------------------+
//	| fee u64 LE | size u64 LE | flags u8 | parentCount u32 LE |   8 + 8 + 1 + 4 = 21 B
//	+------------+-------------+----------+-------------------+
//	| parentCount x 32 B parent tx hashes                      |
//	+----------------------------------------------------------+
//	| per parent: voutCount u32 LE, voutCount x u32 LE vout    |
//	+----------------------------------------------------------+
//	| [block height u32 BE]                                    |   present iff 4 bytes remain
//	+----------------------------------------------------------+
//
// 1. the fixed part fits;
// 2. the parent count fits in what is left, each parent needing its hash and a vout
//    count (so a hostile count sizes nothing);
// 3. every vout list fits;
// 4. what remains after the last list is 0 or 4 bytes (4: the block height Teranode's
//    txmetacache appends, big-endian).
//
// Counts are compared with what is left before anything is multiplied, in 64 bits, so no
// count wraps an offset on any platform. The golden values (golden/txmeta/cases.json)
// hold this decoder, the Python one and the JVM's to the same answers.

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// Sizes of the layout.
const (
	HashSize   = 32            // a tx hash (chainhash.Hash)
	FixedSize  = 8 + 8 + 1 + 4 // fee + size + flags + parentCount
	HeightSize = 4             // the optional block height
	MinSize    = FixedSize     // no parents, no height: the smallest value that decodes (21)
)

// Bits of Flags, as Teranode's meta.Data reads them (stores/utxo/meta).
const (
	FlagCoinbase    = 1 << 0
	FlagFrozen      = 1 << 1
	FlagConflicting = 1 << 2
	FlagLocked      = 1 << 3
)

// ErrMalformed is the kind of every error Decode returns: the value is not a txmeta value.
var ErrMalformed = errors.New("txmeta: malformed value")

// MalformedError says which check a value failed; errors.Is(err, ErrMalformed).
type MalformedError struct {
	Len int    // the value's length
	Why string // the check it failed
}

func (e *MalformedError) Error() string {
	return fmt.Sprintf("txmeta: a value of %d bytes is malformed: %s", e.Len, e.Why)
}

func (e *MalformedError) Unwrap() error { return ErrMalformed }

// Meta is one decoded value. Decode fills it and owns its slices: they are reused by the
// next Decode into the same Meta, so copy what must outlive it. Reuse one Meta per
// goroutine and nothing is allocated once its buffers have grown to the largest value.
type Meta struct {
	Fee         uint64     // satoshis
	Size        uint64     // the transaction's size in bytes (Teranode's SizeInBytes)
	Flags       uint8      // FlagCoinbase, ...
	Parents     [][32]byte // the parent tx hashes (Teranode's TxInpoints.ParentTxHashes)
	ParentVouts [][]uint32 // per parent, the vouts spent (TxInpoints.Idxs); views into one buffer
	BlockHeight uint32     // valid when HasHeight
	HasHeight   bool       // the value carried a block height
	vouts       []uint32   // every parent's vouts, back to back
}

// IsCoinbase says whether the transaction is a coinbase (FlagCoinbase).
func (m *Meta) IsCoinbase() bool { return m.Flags&FlagCoinbase != 0 }

// Reset empties m, keeping its buffers.
func (m *Meta) Reset() {
	*m = Meta{Parents: m.Parents[:0], ParentVouts: m.ParentVouts[:0], vouts: m.vouts[:0]}
}

// Decode reads value v into m. A malformed value is a *MalformedError and leaves m reset
// (zero fields, no parents), never a panic, whatever the bytes. Nothing is allocated for a
// valid value once m's buffers have grown.
func (m *Meta) Decode(v []byte) error {
	if why := m.decode(v); why != "" {
		return &MalformedError{Len: len(v), Why: why}
	}
	return nil
}

// MarshalJSON gives m as the object every reader's `get --decode txmeta` prints for a
// value ([the readers' contract]): {"fee", "size", "flags", "parents": [hex...],
// "parent_vouts": [[...]...], "block_height": N or null}, an empty list as [], never null.
// A value Decode refused prints {"valid": false} instead: m does not know it was refused.
//
// [the readers' contract]: https://github.com/shmcache/shmcache/blob/main/docs/reader-contract.md#get---decode-txmeta
func (m *Meta) MarshalJSON() ([]byte, error) {
	parents := make([]string, len(m.Parents))
	for j := range m.Parents {
		parents[j] = hex.EncodeToString(m.Parents[j][:])
	}
	vouts := make([][]uint32, len(m.ParentVouts))
	for j, v := range m.ParentVouts {
		vouts[j] = append(make([]uint32, 0, len(v)), v...)
	}
	var height *uint32
	if m.HasHeight {
		height = &m.BlockHeight
	}
	return json.Marshal(struct {
		Fee         uint64     `json:"fee"`
		Size        uint64     `json:"size"`
		Flags       uint8      `json:"flags"`
		Parents     []string   `json:"parents"`
		ParentVouts [][]uint32 `json:"parent_vouts"`
		BlockHeight *uint32    `json:"block_height"`
	}{m.Fee, m.Size, m.Flags, parents, vouts, height})
}

// Decode is m.Decode(v) into a new Meta.
func Decode(v []byte) (*Meta, error) {
	m := new(Meta)
	if err := m.Decode(v); err != nil {
		return nil, err
	}
	return m, nil
}

// Height reads the block height a value carries without decoding the rest: (0, false)
// for a value without one, or a malformed value (it runs Decode's checks).
func Height(v []byte) (uint32, bool) {
	end, why := walk(v)
	if why != "" || len(v)-end != HeightSize {
		return 0, false
	}
	return binary.BigEndian.Uint32(v[end:]), true
}

// walk runs checks 1-4 on v: the offset after the last list, or why v is malformed.
func walk(v []byte) (int, string) {
	n := uint64(len(v))
	if n < FixedSize {
		return 0, "shorter than the fixed 21 bytes"
	}
	pc := uint64(binary.LittleEndian.Uint32(v[17:]))
	p := uint64(FixedSize)
	if pc > (n-p)/(HashSize+4) {
		return 0, "the parent count does not fit"
	}
	p += pc * HashSize
	for range pc {
		if n-p < 4 {
			return 0, "a vout count is cut short"
		}
		vc := uint64(binary.LittleEndian.Uint32(v[p:]))
		p += 4
		if vc > (n-p)/4 {
			return 0, "a vout list does not fit"
		}
		p += vc * 4
	}
	if rest := n - p; rest != 0 && rest != HeightSize {
		return 0, "the bytes after the last vout list are neither none nor a 4-byte height"
	}
	return int(p), ""
}

func (m *Meta) decode(v []byte) string {
	end, why := walk(v)
	if why != "" {
		m.Reset()
		return why
	}
	pc := int(binary.LittleEndian.Uint32(v[17:]))
	m.Fee = binary.LittleEndian.Uint64(v)
	m.Size = binary.LittleEndian.Uint64(v[8:])
	m.Flags = v[16]
	m.Parents = growMin(m.Parents, pc, minParents)
	p := FixedSize
	for j := range m.Parents {
		copy(m.Parents[j][:], v[p:p+HashSize])
		p += HashSize
	}
	// the vouts fill one buffer; every list is a view of it once it has its final size
	total := (end - p - 4*pc) / 4
	m.vouts = growMin(m.vouts, total, minVouts)
	m.ParentVouts = growMin(m.ParentVouts, pc, minParents)
	k := 0
	for j := range pc {
		vc := int(binary.LittleEndian.Uint32(v[p:]))
		p += 4
		list := m.vouts[k : k+vc : k+vc]
		for i := range list {
			list[i] = binary.LittleEndian.Uint32(v[p:])
			p += 4
		}
		m.ParentVouts[j] = list
		k += vc
	}
	m.HasHeight = len(v)-end == HeightSize
	m.BlockHeight = 0
	if m.HasHeight {
		m.BlockHeight = binary.BigEndian.Uint32(v[end:])
	}
	return ""
}

// A Meta's buffers start with room for a typical value (Teranode's have 1-3 parents,
// most with one vout each), so a batch of typical values grows each once, not once for
// every larger value a slot meets.
const (
	minParents = 4
	minVouts   = 8
)

func grow[T any](s []T, n int) []T { return growMin(s, n, 0) }

func growMin[T any](s []T, n, least int) []T {
	if cap(s) < n {
		return make([]T, n, max(n+n/4, least))
	}
	return s[:n]
}
