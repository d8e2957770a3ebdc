package io.shmcache;

import java.io.IOException;
import java.nio.channels.FileChannel;

/**
 * What this JDK reads shared memory and opens files with: on JDK 17-21 the
 * {@link UnsafeMapping} and the {@link DispatcherOpener} (the {@link ThreadOpener} only where
 * the JDK's own open cannot be reached). The jar is multi-release:
 * {@code META-INF/versions/22/io/shmcache/Jdk.class} takes this class's place on JDK 22+,
 * where a MemorySegment mapping and an {@code open(2)} with {@code O_NONBLOCK} serve
 * instead (src/main/java22). The rest of the package is the same class files on every JDK.
 */
final class Jdk {
    private Jdk() {}

    /** How memory is read: "unsafe" here (a method: a constant would be compiled into its callers). */
    static String memory() {
        return "unsafe";
    }

    static Mapping map(FileChannel ch, long from, long size, boolean write) throws IOException {
        return UnsafeMapping.map(ch, from, size, write);
    }

    static FileOpener opener() {
        FileOpener o = DispatcherOpener.ifUsable();
        return o != null ? o : new ThreadOpener();
    }
}
