package io.shmcache;

import static io.shmcache.Layout.*;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.nio.file.attribute.PosixFileAttributes;

/**
 * The readers' companion (docs/segment-format.md, section 13): this process counts its
 * hits and misses in its row of /dev/shm/.shmcache-NAME.readers, so that `shmcache stats`,
 * `top` and the metrics see JVM readers as they see Python and Go ones. A reader that
 * cannot use the companion counts only in its handle; lookups never fail for it, and a
 * companion cut short under the mapping only turns the shared counters off.
 */
final class Companion {
    private final Mapping map;
    private final boolean writable;
    private volatile long row = -1;      // byte offset of this process's row; -1 not claimed yet
    private volatile boolean claimed;     // claim() ran (a row may still be missing: uncounted)
    private volatile boolean lost;

    private Companion(Mapping map, boolean writable) {
        this.map = map;
        this.writable = writable;
    }

    static Path pathOf(String name) {
        return Path.of(SHM_DIR, ".shmcache-" + name + ".readers");
    }

    /**
     * The companion of the cache with this creation id, or null if none is usable (or, with
     * an owner, if another user owns it: not counted in, as the Python reader).
     */
    static Companion open(String name, long creationId, Owner owner) {
        Path path = pathOf(name);
        try {
            BasicFileAttributes a = owner == null
                    ? Files.readAttributes(path, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS)
                    : Files.readAttributes(path, PosixFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
            if (!a.isRegularFile() || a.size() != COMPANION_BYTES) {
                return null;
            }
            if (owner != null && !owner.owns((PosixFileAttributes) a)) {
                return null;
            }
        } catch (IOException e) {
            return null;
        }
        for (boolean write : new boolean[] {true, false}) { // read-only: sums, no counting
            try (FileChannel ch = write
                    ? FileChannel.open(path, StandardOpenOption.READ, StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS)
                    : FileChannel.open(path, StandardOpenOption.READ, LinkOption.NOFOLLOW_LINKS)) {
                if (ch.size() != COMPANION_BYTES) {
                    return null;
                }
                Mapping m = Mapping.map(ch, COMPANION_BYTES, write);
                long version = m.getLong(WORD);
                boolean ours = m.getLongAcquire(0) == COMPANION_MAGIC && (version == 1 || version == 2)
                        && m.getLong(COMPANION_CREATION * WORD) == creationId;
                return ours ? new Companion(m, write) : null;
            } catch (IOException | InternalError e) {
                // not ours to write (try reading), or gone, or cut short: no companion
            }
        }
        return null;
    }

    private static long rowOff(long r) {
        return PAGE + r * ROW_WORDS * WORD;
    }

    /** This process's row: one holding its owner word, else a free one, else a dead owner's. */
    private synchronized void claim() {
        if (claimed) {
            return;
        }
        long me = Liveness.mine();
        if (writable && me != 0) {
            row = find(me);
        }
        claimed = true;
    }

    private long find(long me) {
        for (long r = 0; r < MAX_READERS; r++) {
            if (map.getLongAcquire(rowOff(r) + R_OWNER * WORD) == me) {
                return rowOff(r);
            }
        }
        for (boolean free : new boolean[] {true, false}) {
            for (long r = 0; r < MAX_READERS; r++) {
                long at = rowOff(r) + R_OWNER * WORD;
                long cur = map.getLongAcquire(at);
                if ((cur == 0) == free && (free || !Liveness.isAlive(cur)) && map.compareAndSet(at, cur, me)) {
                    return rowOff(r);
                }
            }
        }
        return -1;
    }

    /** Counts one lookup call in this process's row (claimed at the first call). */
    void add(long hits, long misses, long retries, long corruptions) {
        if (lost) {
            return;
        }
        try {
            if (!claimed) {
                claim();
            }
            long r = row;
            if (r < 0) {
                return;
            }
            map.getAndAdd(r + R_HITS * WORD, hits);
            map.getAndAdd(r + R_MISSES * WORD, misses);
            map.getAndAdd(r + R_BATCHES * WORD, 1);
            if (retries != 0) {
                map.getAndAdd(r + R_RETRIES * WORD, retries);
            }
            if (corruptions != 0) {
                map.getAndAdd(r + R_CORRUPTIONS * WORD, corruptions);
            }
        } catch (InternalError e) {
            lost = true; // cut short by another reader of the group: counters off, the cache untouched
        }
    }

    /** {hits, misses, batches, corruptions} summed over every row, or null if unusable. */
    long[] totals() {
        if (lost) {
            return null;
        }
        long[] t = new long[4];
        try {
            for (long r = 0; r < MAX_READERS; r++) {
                long o = rowOff(r);
                t[0] += map.getLongAcquire(o + R_HITS * WORD);
                t[1] += map.getLongAcquire(o + R_MISSES * WORD);
                t[2] += map.getLongAcquire(o + R_BATCHES * WORD);
                t[3] += map.getLongAcquire(o + R_CORRUPTIONS * WORD);
            }
        } catch (InternalError e) {
            lost = true;
            return null;
        }
        return t;
    }
}
