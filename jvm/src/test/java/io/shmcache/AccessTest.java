package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.nio.file.Path;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The multi-release jar gives each JDK its path (docs/jvm.md "JDKs"), and these tests run on
 * the jar itself: JDK 17-21 read memory through sun.misc.Unsafe and open with the JDK's
 * own open(2) and O_NONBLOCK; JDK 22+ read a MemorySegment and, where this code may call
 * native code ({@code --enable-native-access}), open with open(2) and O_NONBLOCK through the
 * foreign function API; both on the caller's thread. So a test leg on JDK 25 that still ran the base classes fails here.
 */
class AccessTest {
    final ShmFiles shm = new ShmFiles();

    @AfterEach
    void removeWhatWasMade() throws IOException {
        shm.removeAll();
    }

    /** Whether this code's module may call native code (JDK 22+'s Module.isNativeAccessEnabled). */
    static boolean nativeAccess() {
        try {
            return (boolean) Module.class.getMethod("isNativeAccessEnabled").invoke(AccessTest.class.getModule());
        } catch (ReflectiveOperationException e) {
            return false; // before JDK 22
        }
    }

    @Test
    void eachJdkTakesItsPath() {
        boolean segment = Runtime.version().feature() >= 22;
        assertEquals((segment ? "memory-segment" : "unsafe") + " "
                + (!segment || nativeAccess() ? "open-nonblock" : "opener-thread"), Segment.access());
        assertEquals(segment ? "SegmentMapping" : "UnsafeMapping", mappingOf().getClass().getSimpleName());
    }

    /** The mapping a cache's handle reads (a golden segment's). */
    private Mapping mappingOf() {
        Path p = Path.of(Layout.SHM_DIR, shm.name("access"));
        Goldens.write(p, Goldens.bytes(Goldens.cases().get("base")));
        try (Segment seg = Segment.attachPath(p)) {
            Mapped m = seg.acquire();
            seg.release(m);
            return m.map;
        }
    }
}
