//go:build !shmcache_noprefetch

#include "go_asm.h"
#include "textflag.h"

// func prefetchBuckets(t *table, hashes []uint64)
TEXT ·prefetchBuckets(SB), NOSPLIT|NOFRAME, $0-32
	MOVQ t+0(FP), DI
	MOVQ hashes_base+8(FP), SI
	MOVQ hashes_len+16(FP), CX
	TESTQ CX, CX
	JLE bdone
	MOVQ table_meta(DI), R8
	MOVQ table_index(DI), R9
	MOVQ table_slots(DI), R10
	LEAQ -1(R10), R11 // mask
bkey:
	MOVQ (SI), AX
	MOVQ AX, BX
	ANDQ $(const_NBuckets-1), BX // b
	MOVQ BX, DX
	SHLQ $6, DX                  // b's meta row: 64 bytes a row
	PREFETCHT0 (R8)(DX*1)
	SHRQ $const_bucketBits, AX
	ANDQ R11, AX                 // the home slot
	IMULQ R10, BX
	ADDQ BX, AX                  // its word in the index
	PREFETCHT0 (R9)(AX*8)
	ADDQ $8, SI
	DECQ CX
	JNZ bkey
bdone:
	RET

// func prefetchRecords(t *table, hashes []uint64, want int64): recordAhead's lines
TEXT ·prefetchRecords(SB), NOSPLIT|NOFRAME, $0-40
	MOVQ hashes_base+8(FP), SI
	MOVQ hashes_len+16(FP), CX
	TESTQ CX, CX
	JLE rdone
	MOVQ t+0(FP), DI
	MOVQ table_ring(DI), R9
	MOVQ table_rsize(DI), R12
	MOVQ table_slots(DI), R11
	DECQ R11 // mask
rkey:
	MOVQ (SI), AX
	MOVQ AX, BX
	ANDQ $(const_NBuckets-1), BX // b
	MOVQ AX, DX
	SHRQ $const_bucketBits, DX
	ANDQ R11, DX                 // sl: the home slot
	SHRQ $const_tagShift, AX     // the tag
	LEAQ 1(R11), R10
	MOVQ R10, R13
	IMULQ BX, R10
	MOVQ t+0(FP), DI
	MOVQ table_index(DI), DI
	LEAQ (DI)(R10*8), DI         // b's index row
	CMPQ R13, $const_aheadProbe
	JLE walk
	MOVQ $const_aheadProbe, R13  // slots to follow: min(slots, aheadProbe)
walk:
	MOVQ (DI)(DX*8), R8          // the slot
	TESTQ R8, R8
	JEQ rnext                    // empty: the probe path ends
	MOVQ R8, R10
	SARQ $const_posBits, R10
	CMPQ R10, AX
	JEQ found                    // the first slot of the key's tag
	INCQ DX
	ANDQ R11, DX
	DECQ R13
	JNZ walk
	JMP rnext
found:
	SHLQ $(64-const_posBits), R8
	SHRQ $(64-const_posBits), R8
	DECQ R8                      // off
	JS rnext
	CMPQ R8, R12
	JGE rnext                    // not inside the ring
	IMULQ R12, BX                // b's ring
	ADDQ BX, R8                  // r, the record
	ADDQ R12, BX                 // its ring's end
	MOVQ want+32(FP), R10
	ADDQ R8, R10
	CMPQ R10, BX
	CMOVQGT BX, R10
	DECQ R10                     // the last byte: min(r + want, the ring's end) - 1
	ANDQ $-64, R8                // the first line
	SUBQ R8, R10
	SHRQ $6, R10                 // lines after the first
	CMPQ R10, $(const_recordLines-1)
	JLE lines
	MOVQ $(const_recordLines-1), R10
lines:
	ADDQ R9, R8
line:
	PREFETCHT0 (R8)
	ADDQ $64, R8
	DECQ R10
	JGE line
rnext:
	ADDQ $8, SI
	DECQ CX
	JNZ rkey
rdone:
	RET
