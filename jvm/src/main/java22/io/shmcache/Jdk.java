package io.shmcache;

import java.io.IOException;
import java.nio.channels.FileChannel;

/**
 * What this JDK reads shared memory and opens files with, on JDK 22+ (this class is
 * {@code META-INF/versions/22/io/shmcache/Jdk.class}; src/main/java's Jdk serves JDK
 * 17-21): the {@link SegmentMapping} (the foreign-memory API, no {@code sun.misc.Unsafe}),
 * and the {@link NativeOpener} where this module may call native code, else the
 * {@link ThreadOpener}.
 *
 * <p>{@code -Dshmcache.memory=unsafe} takes the {@link UnsafeMapping} here too: for the
 * benchmark that compares the two paths on one JDK (bench/test_jvm_paths.py), not for use
 * (it prints the JDK's deprecation warning, and fails under
 * {@code --sun-misc-unsafe-memory-access=deny}).
 */
final class Jdk {
    private Jdk() {}

    private static final boolean UNSAFE = "unsafe".equals(System.getProperty("shmcache.memory"));

    /** How memory is read: "memory-segment", or "unsafe" when asked for. */
    static String memory() {
        return UNSAFE ? "unsafe" : "memory-segment";
    }

    static Mapping map(FileChannel ch, long from, long size, boolean write) throws IOException {
        return UNSAFE ? UnsafeMapping.map(ch, from, size, write) : SegmentMapping.map(ch, from, size, write);
    }

    static FileOpener opener() {
        FileOpener o = NativeOpener.ifUsable();
        return o != null ? o : new ThreadOpener();
    }
}
