//go:build !shmcache_noprefetch

#include "textflag.h"

// func prefetch2(a, b unsafe.Pointer)
TEXT ·prefetch2(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ a+0(FP), AX
	MOVQ b+8(FP), BX
	PREFETCHT0 (AX)
	PREFETCHT0 (BX)
	RET

// func prefetchLines(p unsafe.Pointer, n int): every 64-byte line of [p, p+n), n >= 1
TEXT ·prefetchLines(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ p+0(FP), AX
	MOVQ n+8(FP), CX
	LEAQ -1(AX)(CX*1), CX // the last byte
	ANDQ $-64, AX
loop:
	PREFETCHT0 (AX)
	ADDQ $64, AX
	CMPQ AX, CX
	JLE loop
	RET
