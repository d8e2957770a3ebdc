package io.shmcache;

import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.reflect.Field;
import java.lang.invoke.VarHandle;
import java.nio.Buffer;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicInteger;
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
 * <p>A window is mapped when it is first read (the first at once: the header), not at
 * attach: each is a mapping of its own, and the kernel allows a process
 * {@code vm.max_map_count} of them (65,530 by default), which a file of 64 TiB, a sparse
 * one planted at a name with a header declaring that size, would spend whole at 1 GiB a
 * window, and the JVM would abort on its next mapping of anything. The windows this JVM
 * holds are counted against {@link #BUDGET}, a quarter of that count: a read that needs a
 * window past it throws {@link Mapping.Unmappable} (a corrupt cache for its caller), as
 * does a window the file no longer reaches (cut short: mapping it read-only fails). A
 * read-write mapping (a companion, one window) is mapped whole at once, since mapping past
 * its end would grow the file.
 */
final class UnsafeMapping implements Mapping {
    static final int CHUNK_BITS = 30;
    static final long CHUNK = 1L << CHUNK_BITS;
    private static final long IN_CHUNK = CHUNK - 1;
    private static final boolean LITTLE = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN;
    private static final VarHandle KEY_LONGS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

    static final Unsafe U; // also DispatcherOpener's way to the JDK's own open(2)
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

    /** How many windows this JVM maps at most, all mappings together: a quarter of vm.max_map_count. */
    static final int BUDGET = budget();
    private static final AtomicInteger MAPPED = new AtomicInteger();

    private final FileChannel ch;
    private final long from;
    private final long size;
    private final FileChannel.MapMode mode;
    private final MappedByteBuffer[] chunks; // kept reachable: a window lives as long as this object
    private final long[] base;               // each window's address; 0 until it is mapped
    private boolean unmapped;                // guarded by this

    private UnsafeMapping(FileChannel ch, long from, long size, FileChannel.MapMode mode) {
        this.ch = ch;
        this.from = from;
        this.size = size;
        this.mode = mode;
        int n = (int) ((size + CHUNK - 1) >>> CHUNK_BITS);
        this.chunks = new MappedByteBuffer[n];
        this.base = new long[n];
    }

    /** {@link Mapping#map}: the file as windows of CHUNK bytes, the first mapped now (read-write: all). */
    static UnsafeMapping map(FileChannel ch, long from, long size, boolean write) throws IOException {
        UnsafeMapping m = new UnsafeMapping(ch, from, size, write ? FileChannel.MapMode.READ_WRITE
                : FileChannel.MapMode.READ_ONLY);
        try {
            for (int i = 0; i < (write ? m.base.length : Math.min(1, m.base.length)); i++) {
                m.window(i);
            }
        } catch (Mapping.Unmappable e) {
            m.unmap();
            throw new IOException(e.getMessage(), e);
        }
        return m;
    }

    private static int budget() {
        try {
            String s = Files.readString(Path.of("/proc/sys/vm/max_map_count")).trim();
            return Math.max(64, Integer.parseInt(s) / 4);
        } catch (IOException | RuntimeException e) {
            return 65530 / 4;
        }
    }

    /** Windows mapped now in this JVM (tests). */
    static int mapped() {
        return MAPPED.get();
    }

    /**
     * The address of window i, mapping it first if it is not yet: the slow path of
     * {@link #address}, taken once a window.
     */
    private synchronized long window(int i) {
        if (base[i] != 0) {
            return base[i];
        }
        if (unmapped) { // never: a caller reads only while it holds the mapping (Mapped counts them)
            throw new IllegalStateException("a read of a mapping already unmapped");
        }
        if (MAPPED.incrementAndGet() > BUDGET) {
            MAPPED.decrementAndGet();
            throw new Mapping.Unmappable("a read needs window " + i + " of " + base.length + " (1 GiB each) of a file of "
                    + size + " bytes, and this JVM already maps the " + BUDGET + " windows it allows itself (a quarter "
                    + "of vm.max_map_count): no more are mapped");
        }
        long at = (long) i << CHUNK_BITS;
        MappedByteBuffer b;
        try {
            b = ch.map(mode, from + at, Math.min(CHUNK, size - at));
        } catch (IOException | RuntimeException e) {
            MAPPED.decrementAndGet();
            throw new Mapping.Unmappable("window " + i + " (bytes " + (from + at) + " on) of the file cannot be mapped: "
                    + e.getMessage() + "; the file was cut short while this process mapped it");
        }
        chunks[i] = b;
        base[i] = U.getLong(b, ADDRESS);
        return base[i];
    }

    @Override
    public long size() {
        return size;
    }

    /** Unmaps every window now (the buffers' cleaners). */
    @Override
    public synchronized void unmap() {
        if (unmapped) {
            return;
        }
        unmapped = true;
        for (MappedByteBuffer c : chunks) {
            if (c != null) {
                U.invokeCleaner(c);
                MAPPED.decrementAndGet();
            }
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
        int i = (int) (pos >>> CHUNK_BITS);
        long b = base[i];
        return (b != 0 ? b : window(i)) + (pos & IN_CHUNK);
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
        long a = address(pos, Layout.WORD);
        return LITTLE ? U.compareAndSwapLong(null, a, expect, value)
                : U.compareAndSwapLong(null, a, Long.reverseBytes(expect), Long.reverseBytes(value));
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
