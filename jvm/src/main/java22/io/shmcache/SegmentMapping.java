package io.shmcache;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;

/**
 * The {@link Mapping} of JDK 22+: the file mapped as one {@link MemorySegment}
 * ({@code FileChannel.map(mode, from, size, arena)}, any size, no windows) in a shared
 * arena of its own, read with {@link ValueLayout} accesses. No {@code sun.misc.Unsafe}: on
 * JDK 24+ nothing is printed, and {@code --sun-misc-unsafe-memory-access=deny} changes
 * nothing.
 *
 * <p>Every access is checked against the segment's bounds (a position outside it is an
 * {@link IndexOutOfBoundsException}, as on the Unsafe path) and its arena's liveness; the
 * JIT hoists both out of loops. {@link #unmap()} closes the arena, which unmaps at once;
 * {@link Mapped} calls it only once no call reads the mapping, so a close never meets a
 * thread inside an access.
 *
 * <p>A load from a page the file lost (cut short under the mapping) is, inside the JDK, an
 * unsafe access like the Unsafe path's: HotSpot's SIGBUS handler skips it and asks for an
 * asynchronous {@link InternalError}, which {@link Faults#seal()} throws inside the call
 * ({@link Faults} says how, per JDK). So the calls here are scalar loads and a bulk copy
 * only (each a compiled unsafe access or the JDK's unsafe copy stub, both of which the
 * handler knows), never the JDK's vectorized {@code mismatch}, whose stub it does not.
 */
final class SegmentMapping implements Mapping {
    private static final ValueLayout.OfLong WORD = ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final VarHandle CAS = ValueLayout.JAVA_LONG.withOrder(ByteOrder.LITTLE_ENDIAN).varHandle();
    private static final VarHandle KEY_LONGS = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

    private final Arena arena;
    private final MemorySegment seg;
    private final long size;

    private SegmentMapping(Arena arena, MemorySegment seg) {
        this.arena = arena;
        this.seg = seg;
        this.size = seg.byteSize();
    }

    /** {@link Mapping#map}: one segment in an arena of its own. */
    static SegmentMapping map(FileChannel ch, long from, long size, boolean write) throws IOException {
        Arena arena = Arena.ofShared();
        try {
            return new SegmentMapping(arena, ch.map(write ? FileChannel.MapMode.READ_WRITE
                    : FileChannel.MapMode.READ_ONLY, from, size, arena));
        } catch (IOException | RuntimeException | Error e) {
            arena.close();
            throw e;
        }
    }

    @Override
    public long size() {
        return size;
    }

    @Override
    public void unmap() {
        arena.close();
    }

    @Override
    public long getLong(long pos) {
        return seg.get(WORD, pos);
    }

    /** The position itself, checked as every read is. */
    @Override
    public long wordAt(long pos) {
        if (pos < 0 || pos > size - Layout.WORD) {
            throw new IndexOutOfBoundsException("position " + pos + " (+8) of a mapping of " + size + " bytes");
        }
        return pos;
    }

    @Override
    public long touch(long[] at, int n) {
        MemorySegment s = seg;
        long sum = 0;
        for (int i = 0; i < n; i++) {
            sum += s.get(WORD, at[i]);
        }
        return sum;
    }

    @Override
    public boolean compareAndSet(long pos, long expect, long value) {
        return CAS.compareAndSet(seg, pos, expect, value);
    }

    @Override
    public void copy(long pos, byte[] dst, int off, int len) {
        MemorySegment.copy(seg, ValueLayout.JAVA_BYTE, pos, dst, off, len);
    }

    @Override
    public boolean equalsAt(long pos, byte[] key, int off, int len) {
        java.util.Objects.checkFromIndexSize(off, len, key.length);
        MemorySegment s = seg;
        int i = 0;
        for (; i + 8 <= len; i += 8) {
            if (s.get(WORD, pos + i) != (long) KEY_LONGS.get(key, off + i)) {
                return false;
            }
        }
        for (; i < len; i++) {
            if (s.get(ValueLayout.JAVA_BYTE, pos + i) != key[off + i]) {
                return false;
            }
        }
        return true;
    }
}
