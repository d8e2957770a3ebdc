package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Random;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Damage beyond the goldens: a file cut short under the mapping, random byte flips, a
 * cache re-created under its name, the readers' companion. Files made in /dev/shm are
 * removed after each test.
 */
class FaultTest {
    static final Goldens.Case BASE = Goldens.cases().get("base");

    @TempDir
    Path tmp;
    final ShmFiles shm = new ShmFiles();

    @AfterEach
    void removeWhatWasMade() throws IOException {
        shm.removeAll();
    }

    @Test
    void aFileCutShortUnderTheMappingIsAnErrorNamingIt() throws IOException {
        Path p = Goldens.write(tmp.resolve("cut.shm"), Goldens.bytes(BASE));
        try (Segment r = Segment.attachPath(p)) {
            Goldens.Key hit = BASE.keys().get(1);
            assertArrayEquals(hit.value(), r.get(hit.key()));
            try (RandomAccessFile f = new RandomAccessFile(p.toFile(), "rw")) {
                f.setLength(Layout.PAGE);
            }
            r.check(); // what every lookup does every 0.1 s
            ShmcacheException.Corrupt e = assertThrows(ShmcacheException.Corrupt.class, () -> r.get(hit.key()));
            assertTrue(e.getMessage().contains("cut short") && e.getMessage().contains(p.toString()), e.getMessage());
            assertThrows(ShmcacheException.Corrupt.class, () -> r.get(hit.key()), "and stays so");
            assertThrows(ShmcacheException.Corrupt.class, r::stats);
        }
    }

    @Test
    void aFileCutShortBeforeAnyCheckFaultsEveryBatchedReadIntoAnErrorNeverACrash() throws IOException {
        byte[][] keys = BASE.keys().stream().map(Goldens.Key::key).toArray(byte[][]::new);
        byte[] flat = Goldens.endToEnd(keys);
        for (int way = 0; way < 3; way++) {
            Path p = Goldens.write(tmp.resolve("cut" + way + ".shm"), Goldens.bytes(BASE));
            try (Segment r = Segment.attachPath(p); Call c = r.call()) {
                try (RandomAccessFile f = new RandomAccessFile(p.toFile(), "rw")) {
                    f.setLength(Layout.PAGE); // no check() since: the reads themselves meet the lost pages
                }
                int w = way;
                ShmcacheException e = assertThrows(ShmcacheException.Corrupt.class, () -> {
                    switch (w) {
                        case 0 -> c.getPacked(flat, null, keys.length, new Values());
                        case 1 -> c.getBatch(keys, keys.length, new byte[keys.length][]);
                        default -> c.get(keys[1], 0);
                    }
                }, "the call that met the lost pages says so itself, never the JVM's InternalError");
                assertTrue(e.getMessage().contains("cut short"), e.getMessage());
                assertThrows(ShmcacheException.Corrupt.class, () -> c.getPacked(flat, null, keys.length, new Values()));
            }
        }
    }

    @Test
    void aPlantedSparseFileCostsNoMemoryAtAttach() throws Exception {
        String name = shm.name("sparse");
        Path at = Path.of(Layout.SHM_DIR, name);
        byte[] data = Goldens.bytes(BASE);
        try (RandomAccessFile f = new RandomAccessFile(at.toFile(), "rw")) { // the header page only: the rest a hole
            f.setLength(data.length);
            f.write(data, 0, (int) Layout.PAGE);
        }
        long before = blocks(at);
        assertTrue(before * 512 < data.length / 2, "sparse: " + before + " blocks");
        try (Segment r = Segment.attach(name)) {
            assertEquals(before, blocks(at), "attach allocated memory for the planted file");
            r.get(BASE.keys().get(1).key()); // a lookup costs what it touches, no more
            assertTrue(blocks(at) * 512 < data.length / 2, blocks(at) + " blocks after a lookup");
        }
    }

    /** st_blocks of the file at p. */
    static long blocks(Path p) throws Exception {
        Process s = new ProcessBuilder("stat", "-c", "%b", p.toString()).start();
        String out = new String(s.getInputStream().readAllBytes()).trim();
        assertEquals(0, s.waitFor());
        return Long.parseLong(out);
    }

    @Test
    void byteFlipsNeverCrashHangOrReadOutside() {
        byte[] clean = Goldens.bytes(BASE);
        Random rnd = new Random(40);
        byte[][] keys = BASE.keys().stream().map(Goldens.Key::key).toArray(byte[][]::new);
        byte[] flat = Goldens.endToEnd(keys);
        for (int round = 0; round < 200; round++) {
            byte[] data = clean.clone();
            // flips where they matter: the header, the bucket meta rows, the index and the rings
            for (int i = 0; i < 64; i++) {
                int at = switch (i % 4) {
                    case 0 -> rnd.nextInt(128);
                    case 1 -> (int) Layout.META_OFF + rnd.nextInt((int) (Layout.NBUCKETS * 64));
                    default -> (int) Layout.FIXED_BYTES + rnd.nextInt(data.length - (int) Layout.FIXED_BYTES);
                };
                data[at] ^= (byte) (1 << rnd.nextInt(8));
            }
            Path p = Goldens.write(tmp.resolve("flip" + round + ".shm"), data);
            Segment r;
            try {
                r = Segment.attachPath(p);
            } catch (ShmcacheException e) {
                continue; // refused with a named error: fine
            }
            try (r) {
                long t0 = System.nanoTime();
                byte[][] got = r.getMany(keys);
                assertEquals(keys.length, got.length);
                for (byte[] v : got) {
                    assertTrue(v == null || v.length <= 4096);
                }
                Values packed = new Values();
                try (Call c = r.call()) {
                    c.getPacked(flat, null, keys.length, packed);
                }
                for (int i = 0; i < keys.length; i++) {
                    assertTrue(packed.length(i) <= 4096);
                }
                assertTrue(System.nanoTime() - t0 < 30_000_000_000L, "bounded");
            } catch (ShmcacheException e) {
                fail("a lookup on damaged bytes raised instead of counting: " + e);
            }
        }
    }

    @Test
    void aCacheRecreatedUnderItsNameIsMappedAgain() throws Exception {
        String name = shm.name("recreate");
        Path at = Path.of(Layout.SHM_DIR, name);
        Goldens.write(at, Goldens.bytes(BASE));
        Goldens.Key hit = BASE.keys().get(1);
        try (Segment r = Segment.attach(name)) {
            assertArrayEquals(hit.value(), r.get(hit.key()));
            // re-created: another file at the name, this key gone from it
            Goldens.Case other = Goldens.cases().get("record_hash_changed");
            Goldens.Key gone = other.keys().stream().filter(k -> k.value() == null && !k.corrupt()
                    && BASE.keys().stream().anyMatch(b -> java.util.Arrays.equals(b.key(), k.key()) && b.value() != null))
                    .findFirst().orElseThrow();
            Path next = Goldens.write(Path.of(Layout.SHM_DIR, name + ".next"), Goldens.bytes(other));
            Files.move(next, at, java.nio.file.StandardCopyOption.ATOMIC_MOVE, java.nio.file.StandardCopyOption.REPLACE_EXISTING);
            long deadline = System.nanoTime() + 5_000_000_000L;
            while (r.get(gone.key()) != null) { // noticed within 0.1 s of a lookup
                assertTrue(System.nanoTime() < deadline, "the re-created cache was not mapped");
                Thread.onSpinWait();
            }
            Files.delete(at);
            deadline = System.nanoTime() + 5_000_000_000L;
            while (true) {
                try {
                    r.get(hit.key());
                } catch (ShmcacheException.NotFound e) {
                    assertTrue(e.getMessage().contains(name), e.getMessage());
                    break;
                }
                assertTrue(System.nanoTime() < deadline, "the destroyed cache is still read");
            }
        }
    }

    @Test
    void hitsAndMissesAreCountedInTheReadersCompanion() throws Exception {
        String name = shm.name("companion");
        byte[] data = Goldens.bytes(BASE);
        Goldens.write(Path.of(Layout.SHM_DIR, name), data);
        byte[] comp = Goldens.companion(data);
        Goldens.putWord(comp, Layout.PAGE + Layout.ReaderStats.R_HITS * 8L, 5); // a dead reader's row: kept, summed
        Goldens.putWord(comp, Layout.PAGE, (long) Integer.MAX_VALUE << 32 | 1);
        Goldens.write(Companion.pathOf(name), comp);
        byte[][] keys = BASE.keys().stream().map(Goldens.Key::key).toArray(byte[][]::new);
        long hits = BASE.keys().stream().filter(k -> k.value() != null).count();
        try (Segment r = Segment.attach(name)) {
            r.getMany(keys);
            Segment.Stats s = r.stats();
            assertEquals(hits, s.hits());
            assertEquals(5 + hits, s.readerHits());
            assertEquals(keys.length - hits, s.readerMisses());
        }
        try (RandomAccessFile f = new RandomAccessFile(Companion.pathOf(name).toFile(), "r")) {
            f.seek(Layout.PAGE + 64); // the dead reader's row stays; this process took the next free one
            assertEquals(Liveness.mine(), Long.reverseBytes(f.readLong()));
            assertEquals(hits, Long.reverseBytes(f.readLong()));
            assertEquals(keys.length - hits, Long.reverseBytes(f.readLong()));
            assertEquals(1, Long.reverseBytes(f.readLong()), "one batch");
        }
    }

    @Test
    void aMissingCacheIsNotFoundAndABadNameABadArgument() {
        String name = shm.name("missing");
        ShmcacheException e = assertThrows(ShmcacheException.NotFound.class, () -> Segment.attach(name));
        assertTrue(e.getMessage().contains(name), e.getMessage());
        assertEquals("not-found", e.kind());
        ShmcacheException bad = assertThrows(ShmcacheException.BadName.class, () -> Segment.attach("../etc/passwd"));
        assertEquals("bad-argument", bad.kind(), "never looked up");
    }
}
