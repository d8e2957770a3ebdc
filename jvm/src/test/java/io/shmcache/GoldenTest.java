package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.MethodSource;

/** The golden segments: every reader (Python, Go, this one) gives the same answers. */
class GoldenTest {
    static final Map<String, Goldens.Case> CASES = Goldens.cases();

    @TempDir
    Path tmp;

    /** The golden case {@code name}, written under tmp and attached. */
    private Segment attach(String name) {
        return Segment.attachPath(Goldens.write(tmp.resolve(name + ".shm"), Goldens.bytes(CASES.get(name))));
    }

    static Stream<String> damagedHeaders() {
        return CASES.values().stream().filter(c -> c.attachError() != null).map(Goldens.Case::name);
    }

    static Stream<String> readable() {
        return CASES.values().stream().filter(c -> c.attachError() == null && !c.name().equals("live_holder"))
                .map(Goldens.Case::name);
    }

    @Test
    void theGoldensAreAllThere() {
        assertTrue(damagedHeaders().count() >= 10, "damaged headers");
        assertTrue(readable().count() >= 10, "readable segments");
    }

    @ParameterizedTest
    @MethodSource("damagedHeaders")
    void damagedHeadersAreRefusedByKindAndField(String name) {
        Goldens.Case c = CASES.get(name);
        Path p = Goldens.write(tmp.resolve(name + ".shm"), Goldens.bytes(c));
        ShmcacheException e = assertThrows(ShmcacheException.class, () -> Segment.attachPath(p));
        Class<?> kind = switch (c.attachError()) {
            case "not_a_cache" -> ShmcacheException.NotACache.class;
            case "version" -> ShmcacheException.Version.class;
            case "corrupt" -> ShmcacheException.Corrupt.class;
            default -> throw new AssertionError(c.attachError());
        };
        assertInstanceOf(kind, e, e.getMessage());
        assertTrue(e.getMessage().contains(p.toString()), "names the cache: " + e.getMessage());
        if (c.field() != null) {
            assertTrue(e.getMessage().contains("header field " + c.field() + " is"), e.getMessage());
            assertEquals(c.field(), ((ShmcacheException.Corrupt) e).field());
            java.util.regex.Matcher m = java.util.regex.Pattern.compile(" is (-?\\d+); it should be (-?\\d+)[ ,]")
                    .matcher(e.getMessage());
            assertFalse(m.find() && m.group(1).equals(m.group(2)), "a value reported as what it should be: "
                    + e.getMessage());
        }
    }

    @ParameterizedTest
    @MethodSource("readable")
    void everyKeyAnswersAsExpected(String name) {
        Goldens.Case c = CASES.get(name);
        try (Segment r = attach(name)) {
            if (c.entries() != null) {
                assertEquals(c.entries(), r.stats().entries(), "entries");
            }
            List<byte[]> keys = new ArrayList<>();
            for (Goldens.Key k : c.keys()) {
                keys.add(k.key());
                long before = r.stats().corruptions();
                assertArrayEquals(k.value(), r.get(k.key()), name + ": " + k.why());
                assertEquals(k.corrupt(), r.stats().corruptions() > before, name + ": " + k.why() + ": corruption counted?");
                assertEquals(k.value() != null, r.contains(k.key()), name + ": contains: " + k.why());
            }
            byte[][] batch = r.getMany(keys.toArray(new byte[0][]));
            boolean[] present = r.containsMany(keys.toArray(new byte[0][]));
            for (int i = 0; i < keys.size(); i++) {
                Goldens.Key k = c.keys().get(i);
                assertArrayEquals(k.value(), batch[i], name + ": batch: " + k.why());
                assertEquals(k.value() != null, present[i], name + ": batch contains: " + k.why());
            }
        }
    }

    @Test
    void aBucketHeldMidWriteByALiveProcessIsGivenUpAfterTheBound() {
        Goldens.Case c = CASES.get("live_holder");
        byte[] data = Goldens.bytes(c);
        Goldens.putWord(data, c.liveHolderOffset(), Liveness.mine());
        try (Segment r = Segment.attachPath(Goldens.write(tmp.resolve("live_holder.shm"), data))) {
            List<byte[]> held = new ArrayList<>();
            for (Goldens.Key k : c.keys()) {
                if (k.corrupt()) {
                    held.add(k.key());
                }
            }
            long t0 = System.nanoTime();
            byte[][] got = r.getMany(held.toArray(new byte[0][]));
            double took = (System.nanoTime() - t0) / 1e9;
            for (byte[] v : got) {
                assertNull(v);
            }
            assertEquals(held.size(), r.stats().corruptions(), "each held key a counted miss");
            assertTrue(took >= 1.0 && took < 3.0, "one 1 s bound for the whole batch, took " + took);
            long before = r.stats().corruptions();
            for (Goldens.Key k : c.keys()) {
                if (!k.corrupt()) {
                    assertArrayEquals(k.value(), r.get(k.key()), k.why());
                }
            }
            assertEquals(before, r.stats().corruptions(), "the other buckets count nothing");
        }
    }

    @ParameterizedTest
    @MethodSource("readable")
    void theBatchedReadAnswersAsOneKeyAtATimeInChunksOfAnySize(String name) {
        Goldens.Case c = CASES.get(name);
        try (Segment r = attach(name)) {
            List<byte[]> keys = new ArrayList<>();
            List<byte[]> want = new ArrayList<>();
            for (Goldens.Key k : c.keys()) { // each key twice, a null key between
                for (int t = 0; t < 2; t++) {
                    keys.add(k.key());
                    want.add(k.value());
                    keys.add(null);
                    want.add(null);
                }
            }
            for (int chunk : new int[] {1, 3, 64, keys.size()}) {
                long before = r.stats().misses() + r.stats().hits();
                try (Call call = r.call()) {
                    int ks = r.keySize();
                    byte[][] in = new byte[chunk][], vals = new byte[chunk][];
                    boolean[] has = new boolean[chunk], isNull = new boolean[chunk];
                    byte[] flat = new byte[chunk * ks + 5]; // longer than the keys: only n * key_size is read
                    Values packed = new Values();
                    for (int i = 0; i < keys.size(); i += chunk) {
                        int n = Math.min(chunk, keys.size() - i);
                        java.util.Arrays.fill(flat, (byte) 0x5a);
                        for (int j = 0; j < n; j++) {
                            in[j] = keys.get(i + j);
                            isNull[j] = in[j] == null; // its bytes stay 0x5a: never read
                            if (in[j] != null) {
                                System.arraycopy(in[j], 0, flat, j * ks, ks);
                            }
                        }
                        call.getBatch(in, n, vals);
                        call.containsBatch(in, n, has);
                        call.getPacked(flat, isNull, n, packed);
                        boolean[] hasPacked = new boolean[n];
                        call.containsPacked(flat, isNull, n, hasPacked);
                        for (int j = 0; j < n; j++) {
                            String at = name + ": chunk " + chunk + ", key " + (i + j);
                            assertArrayEquals(want.get(i + j), vals[j], at);
                            assertEquals(want.get(i + j) != null, has[j], at);
                            assertArrayEquals(want.get(i + j), packed.copy(j), at + " (packed)");
                            assertEquals(want.get(i + j) == null ? -1 : want.get(i + j).length, packed.length(j), at);
                            assertEquals(want.get(i + j) != null, hasPacked[j], at + " (packed)");
                        }
                    }
                }
                assertEquals(4L * keys.size(), r.stats().misses() + r.stats().hits() - before, "every key counted");
            }
        }
    }

    @Test
    void aKeyOfTheWrongSizeInABatchIsRefusedBeforeAnyKeyIsRead() {
        Goldens.Case c = CASES.get("base");
        try (Segment r = attach("base");
             Call call = r.call()) {
            byte[][] keys = {c.keys().get(0).key(), null, new byte[31]};
            ShmcacheException e = assertThrows(ShmcacheException.KeySize.class, () -> call.getBatch(keys, 3, new byte[3][]));
            assertTrue(e.getMessage().contains("31 bytes"), e.getMessage());
            assertEquals(2, call.badKey());
            assertEquals(0, call.pending(), "nothing read");
        }
    }

    @Test
    void packedKeysShorterThanTheirCountAreRefusedBeforeAnyKeyIsRead() {
        Goldens.Case c = CASES.get("base");
        try (Segment r = attach("base");
             Call call = r.call()) {
            byte[] keys = new byte[3 * r.keySize() - 1];
            ShmcacheException e = assertThrows(ShmcacheException.KeySize.class,
                    () -> call.getPacked(keys, null, 3, new Values()));
            assertTrue(e.getMessage().contains("3 keys of 32 bytes in an array of 95 bytes"), e.getMessage());
            assertEquals(0, call.pending(), "nothing read");
        }
    }

    @Test
    void packedValuesLongerThanTheBufferGrowIt() {
        Goldens.Case c = CASES.get("base");
        try (Segment r = attach("base");
             Call call = r.call()) {
            int n = 20_000; // every key many times: more value bytes than the first buffer holds
            List<Goldens.Key> ks0 = c.keys().stream().filter(k -> k.value() != null && !k.corrupt()).toList();
            byte[] flat = Goldens.endToEnd(java.util.stream.IntStream.range(0, n)
                    .mapToObj(i -> ks0.get(i % ks0.size()).key()).toArray(byte[][]::new));
            Values v = new Values();
            call.getPacked(flat, null, n, v);
            for (int i = 0; i < n; i++) {
                assertArrayEquals(ks0.get(i % ks0.size()).value(), v.copy(i), "key " + i);
            }
        }
    }

    @Test
    void aKeyOfTheWrongSizeIsRefusedNamingTheCache() {
        Goldens.Case c = CASES.get("base");
        Path p = Goldens.write(tmp.resolve("base.shm"), Goldens.bytes(c));
        try (Segment r = Segment.attachPath(p)) {
            ShmcacheException e = assertThrows(ShmcacheException.KeySize.class, () -> r.get(new byte[31]));
            assertTrue(e.getMessage().contains(p.toString()) && e.getMessage().contains("31 bytes"), e.getMessage());
        }
    }
}
