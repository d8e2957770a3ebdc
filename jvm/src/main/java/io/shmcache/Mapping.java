package io.shmcache;

import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.reflect.Field;
import java.lang.invoke.VarHandle;
import java.nio.Buffer;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import sun.misc.Unsafe;

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
    private static final boolean LITTLE = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN;
    private static final VarHandle KEY_LONGS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

    private static final Unsafe U;
    private static final long ADDRESS; // java.nio.Buffer.address: where a direct buffer's memory starts
    private static final long BYTES = Unsafe.ARRAY_BYTE_BASE_OFFSET;

    static {
        try {
            Field f = Unsafe.class.getDeclaredField("theUnsafe");
            f.setAccessible(true);
            U = (Unsafe) f.get(null);
            ADDRESS = U.objectFieldOffset(Buffer.class.getDeclaredField("address"));
        } catch (ReflectiveOperationException e) {
            throw new ExceptionInInitializerError(e);
        }
    }

    final long size;
    private final MappedByteBuffer[] chunks; // kept reachable: the mapping lives as long as this object
    private final long[] base;               // each window's address

    private Mapping(long size, MappedByteBuffer[] chunks) {
        this.size = size;
        this.chunks = chunks;
        this.base = new long[chunks.length];
        for (int i = 0; i < chunks.length; i++) {
            base[i] = U.getLong(chunks[i], ADDRESS);
        }
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

    /**
     * The address of the n bytes at pos, which must lie in the mapping: a position outside it
     * is an IndexOutOfBoundsException, never a read of memory that is not the file's.
     */
    private long address(long pos, long n) {
        if (pos < 0 || pos > size - n) {
            throw new IndexOutOfBoundsException("position " + pos + " (+" + n + ") of a mapping of " + size + " bytes");
        }
        return base[(int) (pos >>> CHUNK_BITS)] + (pos & IN_CHUNK);
    }

    /** The address of the word at pos (checked as every read is), for {@link #touch}. */
    long wordAddress(long pos) {
        return address(pos, Layout.WORD);
    }

    /**
     * Loads the words at addrs[0..n) (addresses of this mapping's words, from
     * {@link #wordAddress}) and returns their sum, which the caller keeps so that the loads
     * are made: a loop of nothing but independent loads, so that the CPU keeps as many of
     * their cache misses in flight as it can (Java has no prefetch instruction).
     */
    long touch(long[] addrs, int n) {
        long s = 0;
        for (int i = 0; i < n; i++) {
            s += U.getLong(addrs[i]);
        }
        return s;
    }

    /**
     * The little-endian word at pos: a raw load at the window's address (the buffer's own
     * getLong costs a dozen instructions of checks a load, which keeps fewer of a batch's
     * cache misses in flight together; bench/README.md "The JVM lookup"). A fault (the file
     * cut short) is the same InternalError the buffer would throw.
     */
    long getLong(long pos) {
        long v = U.getLong(address(pos, Layout.WORD));
        return LITTLE ? v : Long.reverseBytes(v);
    }

    /**
     * An acquire load: the load, then an acquire fence (no later load or store moves above
     * it). The same ordering as VarHandle.getAcquire (on x86-64 both are a plain load the
     * compiler may not reorder).
     */
    long getLongAcquire(long pos) {
        long v = getLong(pos);
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
        java.util.Objects.checkFromIndexSize(off, len, dst.length);
        while (len > 0) {
            int in = (int) (pos & IN_CHUNK);
            int n = (int) Math.min(len, CHUNK - in);
            U.copyMemory(null, address(pos, n), dst, BYTES + off, n);
            pos += n;
            off += n;
            len -= n;
        }
    }

    /** Whether the len bytes at pos (8-aligned) equal key[off..off+len]. */
    boolean equalsAt(long pos, byte[] key, int off, int len) {
        java.util.Objects.checkFromIndexSize(off, len, key.length);
        int i = 0;
        for (; i + 8 <= len; i += 8) { // 8-aligned words never straddle a window
            if (getLong(pos + i) != (long) KEY_LONGS.get(key, off + i)) {
                return false;
            }
        }
        for (; i < len; i++) {
            if (U.getByte(address(pos + i, 1)) != key[off + i]) {
                return false;
            }
        }
        return true;
    }
}
