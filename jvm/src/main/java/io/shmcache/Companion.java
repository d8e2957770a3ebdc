package io.shmcache;

import static io.shmcache.Layout.*;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.file.Path;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The readers' companion (docs/segment-format.md, section 13): this process counts its
 * hits and misses in its row of /dev/shm/.shmcache-NAME.readers, so that `shmcache stats`,
 * `top` and the metrics see JVM readers as they see Python and Go ones. A reader that
 * cannot use the companion counts only in its handle; lookups never fail for it.
 *
 * <p>Any member of the readers' group may write the companion, and so may cut it short. So
 * this reader never maps it for its counts: it writes its row with positional writes
 * ({@code pwrite}) and sums the rows with positional reads, which meet a file cut short as a
 * short read or a size, never as a fault; a companion found shorter than its size turns the
 * counters off and nothing else. The one step a positional write cannot make is the claim
 * of a row, a compare-and-swap of its owner word against other processes: that is made on a
 * mapping of the rows, once per process and companion, unmapped right after, and guarded as
 * a lookup is (a fault thrown inside the claim's own try: {@link Faults}), so a companion cut
 * short during the claim too only turns the counters off.
 *
 * <p>A process has one row per companion, shared by its handles ({@link Row}): its counts
 * are kept in memory, added under the row's lock and written whole (words R_HITS..R_CORRUPTIONS),
 * starting from what the row held when it was claimed (rows are never cleared, so sums never
 * go down).
 *
 * <p>Owner locks (format section 13, a companion of version LOCKS_SINCE or later): the row is
 * held by a write lock on its owner word's bytes, which the JVM takes with {@link
 * FileChannel#tryLock} (a POSIX record lock, the process's). Closing any descriptor of a file
 * drops every such lock the process holds on it, so a JVM opens each companion file once
 * ({@link #CHANNELS}) and never closes it while that file is at its name: every handle of
 * the process shares that channel.
 */
final class Companion {
    private static final String WHAT = " (its readers' companion)";
    private static final Map<String, Row> ROWS = new ConcurrentHashMap<>(); // this process's rows, by companion file
    /** The one open file of each companion file this process uses (dev:ino), kept while it is at its name. */
    private static final Map<String, Shared> CHANNELS = new ConcurrentHashMap<>();

    private final String cache;
    private final Path path;
    private final FileChannel ch;
    private final boolean writable;
    private final boolean locks; // rows are held by owner locks (version >= LOCKS_SINCE)
    private final String key; // the companion file and the cache's creation id
    private volatile Row row;  // this process's row, claimed at the first count; null not yet
    private volatile boolean off;

    private Companion(String cache, Path path, FileOpener.Opened o, boolean writable, boolean locks, String key) {
        this.cache = cache;
        this.path = path;
        this.ch = o.channel();
        this.writable = writable;
        this.locks = locks;
        this.key = key;
    }

    static Path pathOf(String name) {
        return Path.of(SHM_DIR, ".shmcache-" + name + ".readers");
    }

    /**
     * The companion of the cache with this creation id, or null if none is usable (or, with
     * an owner, if another user owns it: not counted in, as the Python reader). One this
     * process may only read gives sums, no counting.
     */
    static Companion open(String name, long creationId, Owner owner) {
        Path path = pathOf(name);
        synchronized (CHANNELS) {
            FileStat now = FileStat.identity(path);
            // the files no longer at the name: their channels go (and with them any row lock in them)
            CHANNELS.entrySet().removeIf(e -> {
                boolean gone = e.getValue().path().equals(path)
                        && (now == null || !e.getKey().equals(now.dev() + ":" + now.ino()));
                if (gone) {
                    e.getValue().opened().close();
                }
                return gone;
            });
            Shared shared = now == null ? null : CHANNELS.get(now.dev() + ":" + now.ino());
            FileOpener.Opened o;
            boolean write;
            if (shared != null) {
                o = shared.opened();
                write = shared.writable();
            } else {
                write = true;
                try {
                    o = FileOpener.INSTANCE.open(name, path, true, WHAT);
                } catch (ShmcacheException.Permission e) {
                    write = false;
                    try {
                        o = FileOpener.INSTANCE.open(name, path, false, WHAT);
                    } catch (ShmcacheException e2) {
                        return null;
                    }
                } catch (ShmcacheException e) {
                    return null; // none, not a regular file: no companion
                }
            }
            Companion c = check(name, path, o, write, creationId, owner);
            if (shared == null) {
                if (c == null) {
                    o.close(); // a file this process holds no lock in (it had no channel of it)
                } else {
                    CHANNELS.put(o.stat().dev() + ":" + o.stat().ino(), new Shared(o, path, write));
                }
            }
            return c;
        }
    }

    /** A companion file's one channel in this process. */
    private record Shared(FileOpener.Opened opened, Path path, boolean writable) {}

    private static Companion check(String name, Path path, FileOpener.Opened o, boolean write, long creationId,
            Owner owner) {
        FileChannel ch = o.channel();
        try {
            FileStat st = o.stat();
            if (st.size() != COMPANION_BYTES || ch.size() != COMPANION_BYTES || (owner != null && !owner.owns(st))) {
                return null;
            }
            ByteBuffer h = ByteBuffer.allocate(3 * (int) WORD).order(ByteOrder.LITTLE_ENDIAN);
            while (h.hasRemaining() && ch.read(h, h.position()) > 0) {
                // the header words, read with pread
            }
            long version = h.getLong((int) WORD);
            if (h.hasRemaining() || h.getLong(0) != ReaderStats.MAGIC || version < 1 || version > ReaderStats.VERSION
                    || h.getLong(ReaderStats.H_CREATION_ID * (int) WORD) != creationId) {
                return null;
            }
            return new Companion(name, path, o, write, version >= ReaderStats.LOCKS_SINCE,
                    st.dev() + ":" + st.ino() + ":" + creationId);
        } catch (IOException e) {
            return null;
        }
    }

    private static long rowOff(long r) {
        return PAGE + r * ROW_WORDS * WORD;
    }

    /**
     * A row of this process in one companion: its byte offset and the counts it holds
     * (R_HITS..R_CORRUPTIONS), written whole after each call under this object's lock.
     */
    static final class Row {
        final long off;
        FileLock lock; // its owner lock, held as long as the process lives (owner locks only)
        final long[] counts = new long[5]; // hits, misses, batches, retries, corruptions
        final ByteBuffer buf = ByteBuffer.allocate(5 * (int) WORD).order(ByteOrder.LITTLE_ENDIAN);

        Row(long off, long[] start) {
            this.off = off;
            System.arraycopy(start, 0, counts, 0, counts.length);
        }
    }

    /**
     * Counts one lookup call in this process's row (claimed at the first call): hits,
     * misses, one batch, retries and corruptions. A companion cut short (or gone bad) turns
     * the counting off; nothing is thrown.
     */
    void add(long hits, long misses, long retries, long corruptions) {
        if (off || !writable) {
            return;
        }
        Row r = row;
        if (r == null) {
            r = claim();
            if (r == null) {
                return;
            }
        }
        synchronized (r) {
            long[] c = r.counts;
            c[0] += hits;
            c[1] += misses;
            c[2] += 1;
            c[3] += retries;
            c[4] += corruptions;
            r.buf.clear();
            for (long v : c) {
                r.buf.putLong(v);
            }
            r.buf.flip();
            try {
                if (ch.size() != COMPANION_BYTES) { // cut short: a write there would grow it again
                    off = true;
                    return;
                }
                while (r.buf.hasRemaining()) {
                    ch.write(r.buf, r.off + ReaderStats.R_HITS * WORD + r.buf.position());
                }
            } catch (IOException e) { // closed by an interrupt, or gone bad: counters off
                off = true;
            }
        }
    }

    /** This process's row, shared by its handles on the same companion; null: none (uncounted). */
    private Row claim() {
        Row r = ROWS.get(key);
        if (r == null) {
            synchronized (ROWS) {
                r = ROWS.get(key);
                if (r == null) {
                    r = claimRow();
                    if (r == null) {
                        off = true; // no row free, or the companion was cut short: uncounted
                        return null;
                    }
                    ROWS.put(key, r);
                }
            }
        }
        row = r;
        return r;
    }

    /**
     * Claims a row by compare-and-swap on a mapping of the rows (section 13): one holding this
     * process's owner word, else the first free one, else the first whose owner is dead; its
     * counts are read as they stand. The mapping is unmapped after; a fault on it (the
     * companion cut short meanwhile) is thrown and caught here ({@link Faults}).
     */
    private Row claimRow() {
        long me = Liveness.mine();
        if (me == 0) {
            return null;
        }
        try {
            if (ch.size() != COMPANION_BYTES) { // cut short (a read-write map would grow it back): no row
                return null;
            }
            Mapping m = Mapping.map(ch, PAGE, COMPANION_BYTES - PAGE, true);
            FileLock[] held = new FileLock[1];
            try {
                long at = locks ? findLocked(m, me, held) : find(m, me);
                long[] start = new long[5];
                if (at >= 0) {
                    for (int i = 0; i < 5; i++) {
                        start[i] = m.getLong(at + (ReaderStats.R_HITS + i) * WORD);
                    }
                }
                Faults.seal(); // a fault of the claim is thrown here, inside this try
                if (at < 0) {
                    return null;
                }
                Row r = new Row(PAGE + at, start);
                r.lock = held[0];
                return r;
            } catch (InternalError e) {
                if (!Faults.isFault(e)) {
                    throw e;
                }
                return null;
            } finally {
                m.unmap(); // the claim's only reader: the counts go by positional writes from here
            }
        } catch (IOException e) {
            return null;
        }
    }

    /**
     * With owner locks: the first row, free first, whose owner lock this process can take
     * (its lock is left in {@code held[0]}), its owner word then set by compare-and-swap.
     */
    private long findLocked(Mapping m, long me, FileLock[] held) {
        for (boolean free : new boolean[] {true, false}) {
            for (long r = 0; r < ReaderStats.MAX_READERS; r++) {
                long at = rowOff(r) - PAGE + ReaderStats.R_OWNER * WORD;
                long cur = m.getLongAcquire(at);
                if ((cur == 0) != free) {
                    continue;
                }
                FileLock l;
                try {
                    l = ch.tryLock(PAGE + at, WORD, false);
                } catch (IOException | java.nio.channels.OverlappingFileLockException e) {
                    continue; // held by this JVM, or not ours to lock
                }
                if (l == null) {
                    continue; // a live owner
                }
                if (m.compareAndSet(at, cur, me)) {
                    held[0] = l;
                    return rowOff(r) - PAGE;
                }
                try {
                    l.release();
                } catch (IOException ignored) {
                    // the channel went: nothing held
                }
            }
        }
        return -1;
    }

    private static long find(Mapping m, long me) {
        long rows = ReaderStats.MAX_READERS;
        for (long r = 0; r < rows; r++) {
            if (m.getLongAcquire(rowOff(r) - PAGE + ReaderStats.R_OWNER * WORD) == me) {
                return rowOff(r) - PAGE;
            }
        }
        for (boolean free : new boolean[] {true, false}) {
            for (long r = 0; r < rows; r++) {
                long at = rowOff(r) - PAGE + ReaderStats.R_OWNER * WORD;
                long cur = m.getLongAcquire(at);
                if ((cur == 0) == free && (free || !Liveness.isAlive(cur)) && m.compareAndSet(at, cur, me)) {
                    return rowOff(r) - PAGE;
                }
            }
        }
        return -1;
    }

    /**
     * Sums over every row ever used, read with positional reads: {reader_hits, reader_misses,
     * reader_batches, reader_corruptions, readers (rows whose owner is alive)}; null if the
     * companion is unusable (cut short: the counters turn off).
     */
    long[] totals() {
        if (off) {
            return null;
        }
        ByteBuffer b = ByteBuffer.allocate((int) (COMPANION_BYTES - PAGE)).order(ByteOrder.LITTLE_ENDIAN);
        try {
            while (b.hasRemaining() && ch.read(b, PAGE + b.position()) > 0) {
                // every row
            }
        } catch (IOException e) {
            off = true;
            return null;
        }
        if (b.hasRemaining()) { // cut short
            off = true;
            return null;
        }
        long[] t = new long[5];
        for (long r = 0; r < ReaderStats.MAX_READERS; r++) {
            int o = (int) (rowOff(r) - PAGE);
            t[0] += b.getLong(o + ReaderStats.R_HITS * (int) WORD);
            t[1] += b.getLong(o + ReaderStats.R_MISSES * (int) WORD);
            t[2] += b.getLong(o + ReaderStats.R_BATCHES * (int) WORD);
            t[3] += b.getLong(o + ReaderStats.R_CORRUPTIONS * (int) WORD);
            long owner = b.getLong(o + ReaderStats.R_OWNER * (int) WORD);
            if (Liveness.isAlive(owner, ch, (PAGE + o) / WORD + ReaderStats.R_OWNER, locks)) {
                t[4]++;
            }
        }
        return t;
    }

    /** Whether this process counts in the companion (a row claimed and in use). */
    boolean counting() {
        return !off && row != null;
    }

    @Override
    public String toString() {
        return "readers' companion " + path + " of cache '" + cache + "'";
    }
}
