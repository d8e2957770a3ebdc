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
 * The {@link Mapping} of JDK 17-21: loads at the mapped window's address through
 * {@code sun.misc.Unsafe} (the buffer's own getLong costs a dozen instructions of checks a
 * load, which keeps fewer of a batch's cache misses in flight together; bench/README.md
 * "The JVM lookup"), every position checked against the mapping first.
 *
 * <p>A whole file mapped as consecutive windows of {@code CHUNK} bytes (a MappedByteBuffer
 * holds at most 2 GiB; Java 17 has no final foreign-memory API). Every shared word is
 * 8-aligned and CHUNK is a multiple of 8, so no word straddles two windows; byte runs
 * (keys, values) are split where they cross one.
 *
 * <p>{@link #unmap()} unmaps the windows at once through their cleaners
 * ({@code Unsafe.invokeCleaner}).
 */
final class UnsafeMapping implements Mapping {
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

    private final long size;
    private final MappedByteBuffer[] chunks; // kept reachable: the mapping lives as long as this object
    private final long[] base;               // each window's address

    private UnsafeMapping(long size, MappedByteBuffer[] chunks) {
        this.size = size;
        this.chunks = chunks;
        this.base = new long[chunks.length];
        for (int i = 0; i < chunks.length; i++) {
            base[i] = U.getLong(chunks[i], ADDRESS);
        }
    }

    /** {@link Mapping#map}: the file as windows of CHUNK bytes. */
    static UnsafeMapping map(FileChannel ch, long from, long size, boolean write) throws IOException {
        int n = (int) ((size + CHUNK - 1) >>> CHUNK_BITS);
        MappedByteBuffer[] chunks = new MappedByteBuffer[n];
        FileChannel.MapMode mode = write ? FileChannel.MapMode.READ_WRITE : FileChannel.MapMode.READ_ONLY;
        for (int i = 0; i < n; i++) {
            long at = (long) i << CHUNK_BITS;
            chunks[i] = ch.map(mode, from + at, Math.min(CHUNK, size - at));
            chunks[i].order(ByteOrder.LITTLE_ENDIAN);
        }
        return new UnsafeMapping(size, chunks);
    }

    @Override
    public long size() {
        return size;
    }

    /** Unmaps every window now (the buffers' cleaners). */
    @Override
    public void unmap() {
        for (MappedByteBuffer c : chunks) {
            U.invokeCleaner(c);
        }
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

    /** The address of the word at pos (checked as every read is). */
    @Override
    public long wordAt(long pos) {
        return address(pos, Layout.WORD);
    }

    @Override
    public long touch(long[] addrs, int n) {
        long s = 0;
        for (int i = 0; i < n; i++) {
            s += U.getLong(addrs[i]);
        }
        return s;
    }

    /** A raw load at the window's address. */
    @Override
    public long getLong(long pos) {
        long v = U.getLong(address(pos, Layout.WORD));
        return LITTLE ? v : Long.reverseBytes(v);
    }

    @Override
    public boolean compareAndSet(long pos, long expect, long value) {
        return LONGS.compareAndSet(chunks[(int) (pos >>> CHUNK_BITS)], (int) (pos & IN_CHUNK), expect, value);
    }

    @Override
    public void copy(long pos, byte[] dst, int off, int len) {
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

    @Override
    public boolean equalsAt(long pos, byte[] key, int off, int len) {
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
