package io.shmcache;

import java.io.IOException;
import java.lang.invoke.VarHandle;
import java.nio.channels.FileChannel;

/**
 * The one place this package reads shared memory: every load of a mapped file goes through
 * these methods, so that the lookups ({@link Call}), the batch stages ({@link Stages}), the
 * companion's claim and the Spark functions are written once for every JDK.
 *
 * <p>Two implementations, one per JVM, as {@link Jdk} picks: {@link UnsafeMapping} on JDK
 * 17-21 (loads at the mapped address through {@code sun.misc.Unsafe}) and, from the jar's
 * {@code META-INF/versions/22}, {@code SegmentMapping} on JDK 22+ (a {@code MemorySegment}
 * of the file mapped in a shared arena, read with {@code ValueLayout} accesses; no
 * {@code sun.misc.Unsafe}, so JDK 24+ prints no warning and {@code
 * --sun-misc-unsafe-memory-access=deny} changes nothing). A JVM loads one of them only, so
 * every call here is monomorphic and compiled inline.
 *
 * <p>Positions count bytes from the start of what was mapped. A position outside the
 * mapping is an {@link IndexOutOfBoundsException}, never a read of memory that is not the
 * file's. A fault in a load (the file cut short under the mapping) does not surface from
 * these methods: the JVM throws its {@link InternalError} later, and every call of this
 * package ends with {@link Faults#seal()}, which makes it be thrown inside the call.
 */
interface Mapping {
    /**
     * Maps {@code size} bytes of ch from file offset {@code from} (a multiple of the page
     * size), read-only or read-write (MAP_SHARED either way), never populated: pages are
     * filled as they are touched.
     */
    static Mapping map(FileChannel ch, long from, long size, boolean write) throws IOException {
        return Jdk.map(ch, from, size, write);
    }

    /** How many bytes are mapped. */
    long size();

    /**
     * Unmaps now. The caller guarantees that no thread reads this mapping from now on
     * ({@link Mapped} counts its calls in and out): a read after it would touch memory that
     * is no longer the file's.
     */
    void unmap();

    /** The little-endian word at pos. */
    long getLong(long pos);

    /**
     * An acquire load: the load, then an acquire fence (no later load or store moves above
     * it). The ordering of VarHandle.getAcquire (on x86-64 both are a plain load the
     * compiler may not reorder).
     */
    default long getLongAcquire(long pos) {
        long v = getLong(pos);
        VarHandle.acquireFence();
        return v;
    }

    /** A compare-and-swap of the (8-aligned) word at pos, of a read-write mapping. */
    boolean compareAndSet(long pos, long expect, long value);

    /** Copies len bytes at pos into dst[off..]. */
    void copy(long pos, byte[] dst, int off, int len);

    /** Whether the len bytes at pos (8-aligned) equal key[off..off+len]. */
    boolean equalsAt(long pos, byte[] key, int off, int len);

    /**
     * What {@link #touch} takes for the word at pos: the position checked as every read is
     * (an address on the Unsafe path, the position itself on the segment path).
     */
    long wordAt(long pos);

    /**
     * Loads the words at[0..n) (each from {@link #wordAt}) and returns their sum, which the
     * caller keeps so that the loads are made: a loop of nothing but independent loads, so
     * that the CPU keeps as many of their cache misses in flight as it can (Java has no
     * prefetch instruction).
     */
    long touch(long[] at, int n);

    /**
     * A read this mapping cannot serve: the window it falls in cannot be mapped (the file no
     * longer reaches it, or the JVM's budget of mappings is spent: {@link UnsafeMapping}). An
     * {@link InternalError}, as the JVM's report of a fault in a load is, so that every call
     * of this package meets it in the {@code catch} that meets a fault ({@link Faults#isFault}),
     * and makes it {@link ShmcacheException.Corrupt} of the call, naming what happened.
     */
    final class Unmappable extends InternalError {
        private static final long serialVersionUID = 1L;

        Unmappable(String message) {
            super(message);
        }
    }
}
