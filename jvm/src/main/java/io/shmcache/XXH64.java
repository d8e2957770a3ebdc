package io.shmcache;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.Objects;

/**
 * XXH64 with seed 0, the hash of a key (docs/segment-format.md section 5), over a range of a
 * byte array. Written here rather than taken from lz4-java, which Spark ships: its fastest
 * Java instance reads through {@code sun.misc.Unsafe}, so on JDK 24+ it prints the JVM's
 * deprecation warning, and under {@code --sun-misc-unsafe-memory-access=deny} it is not
 * there to take. The little-endian words are read through a byte-array view VarHandle,
 * which the JIT compiles to the same single load. XXH64Test holds it to lz4-java's.
 */
final class XXH64 {
    private XXH64() {}

    private static final long P1 = 0x9E3779B185EBCA87L;
    private static final long P2 = 0xC2B2AE3D27D4EB4FL;
    private static final long P3 = 0x165667B19E3779F9L;
    private static final long P4 = 0x85EBCA77C2B2AE63L;
    private static final long P5 = 0x27D4EB2F165667C5L;
    private static final VarHandle LONG = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    private static final VarHandle INT = MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.LITTLE_ENDIAN);

    /** The XXH64 of b[off..off+len) with the given seed. */
    static long hash(byte[] b, int off, int len, long seed) {
        Objects.checkFromIndexSize(off, len, b.length);
        int end = off + len;
        long h;
        if (len >= 32) {
            long v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
            int limit = end - 32;
            do { // four lanes of 8 bytes a stripe
                v1 = round(v1, (long) LONG.get(b, off));
                v2 = round(v2, (long) LONG.get(b, off + 8));
                v3 = round(v3, (long) LONG.get(b, off + 16));
                v4 = round(v4, (long) LONG.get(b, off + 24));
                off += 32;
            } while (off <= limit);
            h = Long.rotateLeft(v1, 1) + Long.rotateLeft(v2, 7) + Long.rotateLeft(v3, 12) + Long.rotateLeft(v4, 18);
            h = merge(h, v1);
            h = merge(h, v2);
            h = merge(h, v3);
            h = merge(h, v4);
        } else {
            h = seed + P5;
        }
        h += len;
        for (; off + 8 <= end; off += 8) {
            h ^= round(0, (long) LONG.get(b, off));
            h = Long.rotateLeft(h, 27) * P1 + P4;
        }
        if (off + 4 <= end) {
            h ^= ((int) INT.get(b, off) & 0xFFFFFFFFL) * P1;
            h = Long.rotateLeft(h, 23) * P2 + P3;
            off += 4;
        }
        for (; off < end; off++) {
            h ^= (b[off] & 0xFFL) * P5;
            h = Long.rotateLeft(h, 11) * P1;
        }
        h ^= h >>> 33;
        h *= P2;
        h ^= h >>> 29;
        h *= P3;
        return h ^ (h >>> 32);
    }

    private static long round(long acc, long input) {
        return Long.rotateLeft(acc + input * P2, 31) * P1;
    }

    private static long merge(long h, long v) {
        return (h ^ round(0, v)) * P1 + P4;
    }
}
