package io.shmcache;

import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;

/**
 * A whole file mapped as consecutive windows of {@code CHUNK} bytes (a MappedByteBuffer
 * holds at most 2 GiB; Java 17 has no final foreign-memory API). Every shared word is
 * 8-aligned and CHUNK is a multiple of 8, so no word straddles two windows; byte runs
 * (keys, values) are split where they cross one.
 *
 * <p>The buffers are never unmapped explicitly: a mapping no handle refers to any more is
 * unmapped by the garbage collector, so no thread can touch an unmapped address. A fault
 * in a window (the file cut short under it) surfaces from these methods as the
 * {@link InternalError} the JDK makes of the SIGBUS; callers turn it into an error.
 */
final class Mapping {
    static final int CHUNK_BITS = 30;
    static final long CHUNK = 1L << CHUNK_BITS;
    private static final long IN_CHUNK = CHUNK - 1;
    private static final VarHandle LONGS = MethodHandles.byteBufferViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    private static final VarHandle KEY_LONGS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

    final long size;
    private final MappedByteBuffer[] chunks;

    private Mapping(long size, MappedByteBuffer[] chunks) {
        this.size = size;
        this.chunks = chunks;
    }

    /** Maps {@code size} bytes of ch from 0, read-only or read-write (MAP_SHARED either way). */
    static Mapping map(FileChannel ch, long size, boolean write) throws IOException {
        int n = (int) ((size + CHUNK - 1) >>> CHUNK_BITS);
        MappedByteBuffer[] chunks = new MappedByteBuffer[n];
        FileChannel.MapMode mode = write ? FileChannel.MapMode.READ_WRITE : FileChannel.MapMode.READ_ONLY;
        for (int i = 0; i < n; i++) {
            long at = (long) i << CHUNK_BITS;
            chunks[i] = ch.map(mode, at, Math.min(CHUNK, size - at));
            chunks[i].order(ByteOrder.LITTLE_ENDIAN);
        }
        return new Mapping(size, chunks);
    }

    long getLong(long pos) {
        return chunks[(int) (pos >>> CHUNK_BITS)].getLong((int) (pos & IN_CHUNK));
    }

    /**
     * An acquire load: the load, then an acquire fence (no later load or store moves above
     * it). The same ordering as VarHandle.getAcquire, without the view handle's per-access
     * checks (on x86-64 both are a plain load the compiler may not reorder).
     */
    long getLongAcquire(long pos) {
        long v = chunks[(int) (pos >>> CHUNK_BITS)].getLong((int) (pos & IN_CHUNK));
        VarHandle.acquireFence();
        return v;
    }

    boolean compareAndSet(long pos, long expect, long value) {
        return LONGS.compareAndSet(chunks[(int) (pos >>> CHUNK_BITS)], (int) (pos & IN_CHUNK), expect, value);
    }

    void getAndAdd(long pos, long delta) {
        LONGS.getAndAdd(chunks[(int) (pos >>> CHUNK_BITS)], (int) (pos & IN_CHUNK), delta);
    }

    /** Copies len bytes at pos into dst[off..]. */
    void copy(long pos, byte[] dst, int off, int len) {
        while (len > 0) {
            int in = (int) (pos & IN_CHUNK);
            int n = (int) Math.min(len, CHUNK - in);
            chunks[(int) (pos >>> CHUNK_BITS)].get(in, dst, off, n);
            pos += n;
            off += n;
            len -= n;
        }
    }

    /** Whether the len bytes at pos (8-aligned) equal key[off..off+len]. */
    boolean equalsAt(long pos, byte[] key, int off, int len) {
        int i = 0;
        for (; i + 8 <= len; i += 8) { // 8-aligned words never straddle a window
            if (getLong(pos + i) != (long) KEY_LONGS.get(key, off + i)) {
                return false;
            }
        }
        for (; i < len; i++) {
            long p = pos + i;
            if (chunks[(int) (p >>> CHUNK_BITS)].get((int) (p & IN_CHUNK)) != key[off + i]) {
                return false;
            }
        }
        return true;
    }
}
