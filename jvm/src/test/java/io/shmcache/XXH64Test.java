package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import java.util.Random;
import net.jpountz.xxhash.XXHash64;
import net.jpountz.xxhash.XXHashFactory;
import org.junit.jupiter.api.Test;

/**
 * The reader's own XXH64 gives lz4-java's (Spark's; its safe instance, which reads no
 * memory through sun.misc.Unsafe) for every length from 0 to 300 at every offset
 * alignment, seeds included, and the published value of the empty input; the golden
 * segments (GoldenTest) hold it to the format's keys as well.
 */
class XXH64Test {
    @Test
    void givesLz4JavasHashForEveryLengthAndOffset() {
        XXHash64 ref = XXHashFactory.safeInstance().hash64();
        Random rnd = new Random(47);
        byte[] b = new byte[320];
        for (int round = 0; round < 20; round++) {
            rnd.nextBytes(b);
            long seed = round == 0 ? 0 : rnd.nextLong();
            for (int off = 0; off < 8; off++) {
                for (int len = 0; len + off <= 300; len++) {
                    assertEquals(ref.hash(b, off, len, seed), XXH64.hash(b, off, len, seed),
                            "length " + len + " at offset " + off + ", seed " + seed);
                }
            }
        }
        assertEquals(0xEF46DB3751D8E999L, XXH64.hash(new byte[0], 0, 0, 0L), "XXH64 of nothing");
    }

    @Test
    void aRangeOutsideTheArrayIsAnError() {
        assertThrows(IndexOutOfBoundsException.class, () -> XXH64.hash(new byte[8], 4, 8, 0L));
    }
}
