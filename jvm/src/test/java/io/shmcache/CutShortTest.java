package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * A file cut short under the mapping (format section 4): the call that meets the lost pages
 * throws {@link ShmcacheException.Corrupt} ("cut short"), and the JVM's asynchronous
 * InternalError never reaches the caller, inside or outside this package's calls; no thread
 * dies. A thread looks keys up in batches in a tight loop (compiled code, after a warm-up),
 * allocating between calls as a service does (an allocation's slow path is where JDK 17
 * delivers a pending fault), while another truncates the file, many times.
 */
class CutShortTest {
    static final Goldens.Case BASE = Goldens.cases().get("base");
    static final int ROUNDS = Integer.getInteger("shmcache.cut.rounds", 40);

    final ShmFiles shm = new ShmFiles();

    @AfterEach
    void removeWhatWasMade() throws IOException {
        shm.removeAll();
    }

    /** 256 keys: the golden's, and keys of every part of the file (misses that read index slots everywhere). */
    private static byte[] batch(Random rnd) {
        byte[] flat = new byte[256 * 32];
        for (int i = 0; i < 256; i++) {
            byte[] k = i < BASE.keys().size() ? BASE.keys().get(i).key() : new byte[32];
            if (i >= BASE.keys().size()) {
                rnd.nextBytes(k);
            }
            System.arraycopy(k, 0, flat, i * 32, 32);
        }
        return flat;
    }

    @Test
    void aFileCutShortUnderATightLoopOfBatchesIsCorruptOfTheCallAndNothingElse() throws Exception {
        byte[] data = Goldens.bytes(BASE);
        Random rnd = new Random(45);
        byte[] flat = batch(rnd);
        List<Throwable> escaped = Collections.synchronizedList(new ArrayList<>());
        Path warm = Path.of(Layout.SHM_DIR, shm.name("cut-warm"));
        Goldens.write(warm, data);
        try (Segment seg = Segment.attachPath(warm); Call c = seg.call()) { // compiled code before the first cut
            Values v = new Values();
            for (int i = 0; i < 20_000; i++) {
                c.getPacked(flat, null, 256, v);
            }
        }
        int corrupt = 0;
        for (int round = 0; round < ROUNDS; round++) {
            Path p = Path.of(Layout.SHM_DIR, shm.name("cut-" + round));
            Goldens.write(p, data);
            Segment seg = Segment.attachPath(p);
            AtomicLong calls = new AtomicLong();
            AtomicInteger outcome = new AtomicInteger(); // 1: Corrupt met
            CountDownLatch over = new CountDownLatch(1);
            Thread reader = new Thread(() -> {
                Values v = new Values();
                List<byte[]> junk = new ArrayList<>();
                try (Call c = seg.call()) {
                    while (outcome.get() == 0) {
                        try {
                            if ((calls.get() & 1) == 0) {
                                c.getPacked(flat, null, 256, v);
                            } else {
                                c.getBatch(Goldens.split(flat, 32), 256, new byte[256][]);
                            }
                        } catch (ShmcacheException.Corrupt e) {
                            assertTrue(e.getMessage().contains("cut short") && e.getMessage().contains(p.toString()),
                                    e.getMessage());
                            outcome.set(1);
                        }
                        calls.incrementAndGet();
                        try { // a service's own work between calls: allocations, some of them large
                            junk.add(new byte[64 + (int) (calls.get() % 50_000)]);
                            if (junk.size() > 64) {
                                junk.clear();
                            }
                        } catch (Throwable t) {
                            escaped.add(t);
                        }
                    }
                    for (int i = 0; i < 10; i++) { // and it stays so, never reading the lost pages again
                        assertThrows(ShmcacheException.Corrupt.class, () -> c.getPacked(flat, null, 256, v));
                    }
                } catch (Throwable t) {
                    escaped.add(t);
                } finally {
                    over.countDown();
                }
            }, "cut-short-reader-" + round);
            reader.setUncaughtExceptionHandler((t, e) -> escaped.add(e));
            reader.start();
            long until = calls.get() + 50 + rnd.nextInt(200);
            while (calls.get() < until && reader.isAlive()) {
                Thread.onSpinWait();
            }
            try (RandomAccessFile f = new RandomAccessFile(p.toFile(), "rw")) {
                f.setLength(rnd.nextBoolean() ? Layout.PAGE : Layout.FIXED_BYTES + rnd.nextInt(1 << 20));
            }
            assertTrue(over.await(60, TimeUnit.SECONDS), "the reader never met the cut");
            reader.join();
            seg.close();
            escaped.forEach(Throwable::printStackTrace); // target/surefire-reports: where it was thrown
            assertEquals(List.of(), escaped, "round " + round + ": only the reader's own error, on its own call");
            corrupt += outcome.get();
        }
        assertEquals(ROUNDS, corrupt, "every round ends with the call that met the cut");
    }

    @Test
    void statsAndStatusOfAFileCutShortAreCorruptToo() throws IOException {
        Path p = Path.of(Layout.SHM_DIR, shm.name("cut-stats"));
        Goldens.write(p, Goldens.bytes(BASE));
        try (Segment seg = Segment.attachPath(p)) {
            seg.stats();
            try (RandomAccessFile f = new RandomAccessFile(p.toFile(), "rw")) {
                f.setLength(Layout.PAGE);
            }
            ShmcacheException e = assertThrows(ShmcacheException.Corrupt.class, seg::stats);
            assertTrue(e.getMessage().contains("cut short"), e.getMessage());
            assertThrows(ShmcacheException.Corrupt.class, seg::status);
        }
    }

    @Test
    void aFileCutShortBetweenItsSizeAndItsMappingIsCorruptNotNotACache() throws IOException {
        Path p = Path.of(Layout.SHM_DIR, shm.name("cut-at-attach"));
        Goldens.write(p, Goldens.bytes(BASE));
        try (java.nio.channels.FileChannel ch = java.nio.channels.FileChannel.open(p)) {
            long size = ch.size(); // read by the attach; then the file is cut short, then mapped
            try (RandomAccessFile f = new RandomAccessFile(p.toFile(), "rw")) {
                f.setLength(Layout.PAGE);
            }
            ShmcacheException.Corrupt e = assertThrows(ShmcacheException.Corrupt.class,
                    () -> Mapped.map("x", p, ch, size));
            assertTrue(e.getMessage().contains("cut short"), e.getMessage());
        }
    }
}
