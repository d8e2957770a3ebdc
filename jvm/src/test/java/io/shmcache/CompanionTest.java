package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The readers' companion (format section 13) cut short by a member of the readers' group
 * only turns the shared counters off: lookups go on and are right, on every thread, and no
 * error of the JVM surfaces anywhere; a companion cut short before this process claimed its
 * row is not grown back by the claim.
 */
class CompanionTest {
    static final Goldens.Case BASE = Goldens.cases().get("base");

    final ShmFiles shm = new ShmFiles();

    @AfterEach
    void removeWhatWasMade() throws IOException {
        shm.removeAll();
    }

    static void cut(Path p, long size) throws IOException {
        try (RandomAccessFile f = new RandomAccessFile(p.toFile(), "rw")) {
            f.setLength(size);
        }
    }

    @Test
    void aCompanionCutShortUnderALiveHandleOnlyTurnsTheCountersOff() throws Exception {
        String name = shm.name("comp-cut");
        byte[] data = Goldens.bytes(BASE);
        Goldens.write(Path.of(Layout.SHM_DIR, name), data);
        Path comp = Goldens.write(Companion.pathOf(name), Goldens.companion(data));
        byte[][] keys = BASE.keys().stream().map(Goldens.Key::key).toArray(byte[][]::new);
        List<Throwable> escaped = new ArrayList<>();
        try (Segment r = Segment.attach(name)) {
            for (int i = 0; i < 2000; i++) { // counted in the companion, in compiled code
                r.getMany(keys);
            }
            assertTrue(r.stats().readerBatches() >= 2000, "counted in the companion");
            cut(comp, Layout.PAGE); // every row gone
            for (int i = 0; i < 5000; i++) {
                try {
                    byte[][] got = r.getMany(keys);
                    for (int k = 0; k < keys.length; k++) {
                        assertArrayEquals(BASE.keys().get(k).value(), got[k], "key " + k);
                    }
                    List<byte[]> junk = new ArrayList<>();
                    junk.add(new byte[1 + i % 40_000]); // a service's own work between calls
                } catch (Throwable t) {
                    escaped.add(t);
                    break;
                }
            }
            assertEquals(List.of(), escaped, "the lookups went on, right, with nothing thrown");
            Segment.Stats s = r.stats();
            assertEquals(0, s.readerBatches(), "the shared counters are off");
            assertTrue(s.hits() > 0, "the handle's own go on");
        }
        assertEquals(Layout.PAGE, Files.size(comp), "nothing wrote the companion after it was cut");
    }

    @Test
    void aCompanionCutShortBeforeTheClaimIsNeitherUsedNorGrownBack() throws Exception {
        String name = shm.name("comp-claim");
        byte[] data = Goldens.bytes(BASE);
        Goldens.write(Path.of(Layout.SHM_DIR, name), data);
        Path comp = Goldens.write(Companion.pathOf(name), Goldens.companion(data));
        Goldens.Key hit = BASE.keys().get(1);
        try (Segment r = Segment.attach(name)) { // opened whole; cut before the first lookup claims a row
            cut(comp, Layout.PAGE);
            assertArrayEquals(hit.value(), r.get(hit.key()));
            assertArrayEquals(hit.value(), r.get(hit.key()));
            assertEquals(0, r.stats().readerHits());
        }
        assertEquals(Layout.PAGE, Files.size(comp), "the claim did not grow it back");
    }
}
