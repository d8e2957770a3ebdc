package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Following a name (format section 1): a handle looks at its name at least every 0.1 s of
 * use, a service's one lookup every 10 ms included; once the name holds anything but the
 * file it maps, the old mapping is served no more: a file that is not a cache makes lookups
 * fail with its error while it is there, a FIFO too (without a hang), and a new cache at the
 * name is mapped and served.
 */
class FollowTest {
    static final Goldens.Case BASE = Goldens.cases().get("base");
    static final Goldens.Key HIT = BASE.keys().get(1);

    final ShmFiles shm = new ShmFiles();

    @AfterEach
    void removeWhatWasMade() throws IOException {
        shm.removeAll();
    }

    /** A key the base golden has and the record_hash_changed golden does not: a miss there. */
    static Goldens.Key gone(Goldens.Case other) {
        return other.keys().stream().filter(k -> k.value() == null && !k.corrupt()
                && BASE.keys().stream().anyMatch(b -> java.util.Arrays.equals(b.key(), k.key()) && b.value() != null))
                .findFirst().orElseThrow();
    }

    /** Puts data at the name in one step (a new file renamed over it), as a creator names a whole file. */
    static void putAt(Path at, byte[] data) throws IOException {
        Path next = Path.of(at + ".next");
        Goldens.write(next, data);
        Files.move(next, at, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    }

    @Test
    void aCacheDestroyedAndANonCacheAtItsNameStopsAnsweringWithinHalfASecondAtTenMillisecondsALookup() throws Exception {
        String name = shm.name("follow");
        Path at = Path.of(Layout.SHM_DIR, name);
        Goldens.write(at, Goldens.bytes(BASE));
        try (Segment r = Segment.attach(name)) {
            for (int i = 0; i < 20; i++) { // a service's pace: a lookup every 10 ms
                assertArrayEquals(HIT.value(), r.get(HIT.key()));
                Thread.sleep(10);
            }
            byte[] junk = new byte[1 << 20];
            new Random(45).nextBytes(junk);
            Files.delete(at); // destroyed, and a file that is not a cache put at its name
            putAt(at, junk);
            long t0 = System.nanoTime();
            double stopped = -1;
            while ((System.nanoTime() - t0) / 1e9 < 1.5) {
                try {
                    byte[] v = r.get(HIT.key());
                    assertEquals(-1, stopped, "the old value again after the name's file was refused");
                    assertArrayEquals(HIT.value(), v, "the old mapping, not another file");
                } catch (ShmcacheException.NotACache e) {
                    assertEquals("not-a-cache", e.kind());
                    assertTrue(e.getMessage().contains("bad magic") && e.getMessage().contains(at.toString()),
                            e.getMessage());
                    if (stopped < 0) {
                        stopped = (System.nanoTime() - t0) / 1e9;
                    }
                }
                Thread.sleep(10);
            }
            assertTrue(stopped >= 0 && stopped < 0.5, "the destroyed cache stopped answering after " + stopped + " s");
            Goldens.Case other = Goldens.cases().get("record_hash_changed");
            putAt(at, Goldens.bytes(other)); // a new cache at the name: served
            long t1 = System.nanoTime();
            while (true) {
                try {
                    if (r.get(gone(other).key()) == null) {
                        break;
                    }
                } catch (ShmcacheException.NotACache e) {
                    // the old refusal until the next look
                }
                assertTrue((System.nanoTime() - t1) / 1e9 < 0.5, "the new cache is not served");
                Thread.sleep(10);
            }
        }
    }

    @Test
    void aFifoAtTheNameIsNotACacheWithoutAHangAndTheCacheAfterItIsServed() throws Exception {
        String name = shm.name("fifo");
        Path at = Path.of(Layout.SHM_DIR, name);
        Goldens.write(at, Goldens.bytes(BASE));
        try (Segment r = Segment.attach(name)) {
            assertArrayEquals(HIT.value(), r.get(HIT.key()));
            Files.delete(at);
            Fifos.make(at);
            long t0 = System.nanoTime();
            ShmcacheException e = null;
            while (e == null) {
                try {
                    assertArrayEquals(HIT.value(), r.get(HIT.key()));
                } catch (ShmcacheException.NotACache x) {
                    e = x;
                }
                assertTrue((System.nanoTime() - t0) / 1e9 < 0.5, "the FIFO was not seen");
            }
            assertTrue(e.getMessage().contains("a FIFO"), e.getMessage());
            for (int i = 0; i < 20; i++) { // every lookup looks again while nothing usable is there: none hangs
                long t = System.nanoTime();
                assertThrows(ShmcacheException.NotACache.class, () -> r.get(HIT.key()));
                assertTrue((System.nanoTime() - t) / 1e9 < 1, "a lookup hung on the FIFO");
            }
            putAt(at, Goldens.bytes(BASE));
            assertArrayEquals(HIT.value(), r.get(HIT.key()), "the cache after the FIFO, at the next lookup");
        }
        assertThrows(ShmcacheException.NotACache.class, () -> {
            Files.delete(at);
            Fifos.make(at);
            Segment.attach(name);
        }, "an attach to a FIFO refuses it");
    }

    /** Whether this process maps the file at path (or the file that was there: "(deleted)"). */
    static boolean mapped(Path path) throws IOException {
        return Files.readAllLines(Path.of("/proc/self/maps")).stream()
                .anyMatch(l -> l.replace(" (deleted)", "").endsWith(" " + path));
    }

    @Test
    void theMappingOfAFileNoLongerAtTheNameIsDroppedAtOnceAndACloseUnmaps() throws Exception {
        String name = shm.name("unmap");
        Path at = Path.of(Layout.SHM_DIR, name);
        Goldens.write(at, Goldens.bytes(BASE));
        try (Segment r = Segment.attach(name)) {
            assertArrayEquals(HIT.value(), r.get(HIT.key()));
            assertTrue(mapped(at));
            Files.delete(at);
            long t0 = System.nanoTime();
            while (true) {
                try {
                    r.get(HIT.key());
                } catch (ShmcacheException.NotFound e) {
                    break;
                }
                assertTrue((System.nanoTime() - t0) / 1e9 < 0.5, "the destroyed cache is still served");
            }
            assertFalse(mapped(at), "the destroyed cache's file is still mapped once lookups say it is gone");
            putAt(at, Goldens.bytes(BASE));
            assertArrayEquals(HIT.value(), r.get(HIT.key()), "the new cache, at the next lookup");
            assertTrue(mapped(at));
        }
        assertFalse(mapped(at), "close unmaps");
    }

    @Test
    void aFollowingHandleServesWhateverComesToTheName() throws Exception {
        String name = shm.name("later");
        Path at = Path.of(Layout.SHM_DIR, name);
        try (Segment r = Segment.follow(name, null)) {
            ShmcacheException e = assertThrows(ShmcacheException.NotFound.class, () -> r.get(HIT.key()));
            assertTrue(e.getMessage().contains(at.toString()), e.getMessage());
            putAt(at, Goldens.bytes(BASE));
            assertArrayEquals(HIT.value(), r.get(HIT.key()), "tried again at the next lookup");
            Files.delete(at);
            long t0 = System.nanoTime();
            while (true) {
                try {
                    r.get(HIT.key());
                } catch (ShmcacheException.NotFound x) {
                    break;
                }
                assertTrue((System.nanoTime() - t0) / 1e9 < 0.5, "the destroyed cache is still served");
            }
        }
    }
}
