package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.IOException;
import java.io.RandomAccessFile;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * JDK 17-21's mapping ({@link UnsafeMapping}) maps a window of 1 GiB when it is first read,
 * never more than its budget (a quarter of vm.max_map_count) in the whole JVM: a file of
 * any declared size, however it is read, costs at most that many of the process's
 * mappings, and a read past the budget is an error of the read, never an abort of the JVM
 * (which a file of 64 TiB, mapped whole at attach, was). The file here is a sparse one, two
 * windows larger than the budget; every window is read once, in order.
 */
class BudgetTest {
    @TempDir
    Path tmp;

    @Test
    void aFileLargerThanTheBudgetMapsWindowsAsTheyAreReadUpToTheBudgetAndNoFurther() throws IOException {
        assumeTrue(Runtime.version().feature() < 22, "JDK 22+ maps a file whole, as one MemorySegment");
        int windows = UnsafeMapping.BUDGET + 2;
        Path p = tmp.resolve("sparse");
        try (RandomAccessFile f = new RandomAccessFile(p.toFile(), "rw")) {
            f.setLength((long) windows << UnsafeMapping.CHUNK_BITS); // all hole
        }
        int before = UnsafeMapping.mapped();
        try (FileChannel ch = FileChannel.open(p, StandardOpenOption.READ)) {
            UnsafeMapping m = UnsafeMapping.map(ch, 0, ch.size(), false);
            try {
                assertEquals(before + 1, UnsafeMapping.mapped(), "attach maps its first window only");
                int read = 0;
                Mapping.Unmappable refused = null;
                for (int i = 0; i < windows && refused == null; i++) {
                    try {
                        assertEquals(0, m.getLong((long) i << UnsafeMapping.CHUNK_BITS));
                        read++;
                    } catch (Mapping.Unmappable e) {
                        refused = e;
                    }
                }
                assertEquals(UnsafeMapping.BUDGET - before, read, "windows read before the budget was spent");
                assertNotNull(refused, "a read past the budget was served");
                assertTrue(refused.getMessage().contains("vm.max_map_count"), refused.getMessage());
                assertTrue(Faults.isFault(refused), "every call's catch of a fault meets it");
                assertEquals(UnsafeMapping.BUDGET, UnsafeMapping.mapped());
                assertThrows(Mapping.Unmappable.class, () -> m.getLong((long) (windows - 1) << UnsafeMapping.CHUNK_BITS));
                assertEquals(0, m.getLong(8), "a window already mapped is read on");
            } finally {
                m.unmap();
            }
            assertEquals(before, UnsafeMapping.mapped(), "unmapping gives every window back");
        }
    }

    @Test
    void aWindowTheFileNoLongerReachesIsAnErrorOfTheRead() throws IOException {
        assumeTrue(Runtime.version().feature() < 22, "JDK 22+ maps a file whole, as one MemorySegment");
        Path p = tmp.resolve("cut");
        try (RandomAccessFile f = new RandomAccessFile(p.toFile(), "rw")) {
            f.setLength(3L << UnsafeMapping.CHUNK_BITS);
        }
        try (FileChannel ch = FileChannel.open(p, StandardOpenOption.READ)) {
            UnsafeMapping m = UnsafeMapping.map(ch, 0, ch.size(), false);
            try (RandomAccessFile f = new RandomAccessFile(p.toFile(), "rw")) {
                f.setLength(1L << UnsafeMapping.CHUNK_BITS); // cut short before windows 1 and 2 were read
            }
            try {
                Mapping.Unmappable e = assertThrows(Mapping.Unmappable.class,
                        () -> m.getLong(2L << UnsafeMapping.CHUNK_BITS));
                assertTrue(e.getMessage().contains("cut short"), e.getMessage());
                ShmcacheException.Corrupt c = Mapped.cutShort("x", p, e);
                assertTrue(c.getMessage().contains("cut short") && c.getMessage().contains(p.toString()), c.getMessage());
            } finally {
                m.unmap();
            }
        }
    }
}
