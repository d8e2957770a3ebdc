package io.shmcache;

import static io.shmcache.Layout.*;

import java.nio.file.Path;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Pattern;
import net.jpountz.xxhash.XXHash64;
import net.jpountz.xxhash.XXHashFactory;

/**
 * A read-only handle on one cache (docs/segment-format.md): {@link #attach(String)} maps
 * /dev/shm/NAME read-only after every check of section 4 and joins its readers'
 * companion; {@link #attachPath(Path)} maps a file anywhere (a golden segment), with no
 * companion and no following of a name. Safe for use by many threads; each
 * {@link Call} belongs to one thread.
 *
 * <p>A cache destroyed and created again under its name is another file: a handle
 * attached by name looks at the name every 0.1 s and maps the new file. A file cut short
 * under the mapping makes lookups throw {@link ShmcacheException.Corrupt} ("cut short"),
 * never kill the process. Not guaranteed: the memory of a replaced file stays mapped
 * until the garbage collector drops its buffers (Java cannot unmap a buffer safely).
 *
 * <p>Told its cache's {@link Owner} ({@link #attach(String, Owner)}), a handle refuses a
 * file another user owns with {@link ShmcacheException.WrongOwner} naming both users, at
 * attach and at every re-attach to a re-created cache, before reading any byte of it; a
 * readers' companion another user owns is not counted in.
 */
public final class Segment implements AutoCloseable {
    private static final Pattern NAME = Pattern.compile("[A-Za-z0-9][A-Za-z0-9._-]{0,199}");
    static final XXHash64 XXH64 = XXHashFactory.fastestJavaInstance().hash64();
    private static final System.Logger LOG = System.getLogger("io.shmcache");

    private final String name;
    private final Path path;
    private final boolean follow;
    private final Owner owner;           // null: any owner
    private volatile ShmcacheException.WrongOwner refused; // the file at the name is another user's
    private volatile Mapped cur;        // null: nothing at the name any more
    private volatile Companion comp;    // null: uncounted in shared memory
    private volatile boolean closed;
    private volatile long nextCheck;
    private int untimed; // lookups since the clock was last read (racy across threads: only a pace)
    private static final int CLOCK_EVERY = 64; // read the clock every this many lookups, not each
    final AtomicLong hits = new AtomicLong(), misses = new AtomicLong();
    final AtomicLong retries = new AtomicLong(), corruptions = new AtomicLong();
    private final Set<Long> warned = ConcurrentHashMap.newKeySet();

    private Segment(String name, Path path, boolean follow, Owner owner, Mapped m) {
        this.name = name;
        this.path = path;
        this.follow = follow;
        this.owner = owner;
        this.cur = m;
        if (follow) {
            this.comp = Companion.open(name, m.creationId, owner);
        }
        this.nextCheck = System.nanoTime() + FOLLOW_INTERVAL_NS;
    }

    /** Maps cache {@code name} (/dev/shm/NAME) read-only and joins its readers' companion. */
    public static Segment attach(String name) {
        return attach(name, null);
    }

    /**
     * Maps cache {@code name} if its file belongs to {@code owner} (null: any user), else
     * {@link ShmcacheException.WrongOwner} naming both, before anything of it is read; every
     * re-attach to a re-created cache checks the owner again.
     */
    public static Segment attach(String name, Owner owner) {
        if (name == null || !NAME.matcher(name).matches()) {
            throw new ShmcacheException.NotFound(String.valueOf(name), "not a valid cache name: use 1-200 letters, "
                    + "digits, '.', '_' or '-', starting with a letter or digit");
        }
        Path p = Path.of(SHM_DIR, name);
        return new Segment(name, p, true, owner, Mapped.open(name, p, owner));
    }

    /** Maps a segment's file anywhere: the same checks; no companion, no following. */
    public static Segment attachPath(Path path) {
        return attachPath(path, null);
    }

    /** {@link #attachPath(Path)} of a file that must belong to {@code owner} (null: any user). */
    public static Segment attachPath(Path path, Owner owner) {
        return new Segment(path.toString(), path, false, owner, Mapped.open(path.toString(), path, owner));
    }

    /** The owner this handle insists on, null for any. */
    public Owner owner() {
        return owner;
    }

    public String name() {
        return name;
    }

    public int keySize() {
        return acquire().keySize;
    }

    public long creationId() {
        return acquire().creationId;
    }

    /** One key's value (a copy), null if not found. */
    public byte[] get(byte[] key) {
        try (Call c = call()) {
            return c.get(key, 0);
        }
    }

    /** Whether one key is present. */
    public boolean contains(byte[] key) {
        try (Call c = call()) {
            return c.contains(key, 0);
        }
    }

    /**
     * Each key's value, null where not found or the key is null: one call (one batch in the
     * companion), the keys' cache misses overlapped ({@link Call#getBatch}).
     */
    public byte[][] getMany(byte[][] keys) {
        byte[][] out = new byte[keys.length][];
        try (Call c = call()) {
            c.getBatch(keys, keys.length, out);
        }
        return out;
    }

    /** Whether each key is present (false for a null key): one call, no value copied. */
    public boolean[] containsMany(byte[][] keys) {
        boolean[] out = new boolean[keys.length];
        try (Call c = call()) {
            c.containsBatch(keys, keys.length, out);
        }
        return out;
    }

    /** A lookup call of many keys, counted as one batch when closed (or flushed). */
    public Call call() {
        return new Call(this);
    }

    /** Stats: the table's entries, this handle's counts and the companion's sums (section 15). */
    public Stats stats() {
        Mapped m = acquire();
        long entries;
        try {
            entries = m.entries();
        } catch (InternalError e) {
            m.lost = true;
            throw Mapped.cutShort(name, path, e);
        }
        Companion c = comp;
        long[] t = c == null ? null : c.totals();
        long rh = t == null ? hits.get() : t[0], rm = t == null ? misses.get() : t[1];
        return new Stats(entries, hits.get(), misses.get(), retries.get(), corruptions.get(), rh, rm);
    }

    /** What {@link #stats()} returns; readerHits/readerMisses sum every reader process. */
    public record Stats(long entries, long hits, long misses, long retries, long corruptions,
                        long readerHits, long readerMisses) {}

    /** Unmaps (when the garbage collector drops the buffers); never destroys. Idempotent. */
    @Override
    public void close() {
        closed = true;
        cur = null;
        comp = null;
    }

    /**
     * The mapping to read now; every 64th lookup reads the clock, and every 0.1 s one looks
     * at the file ({@link #check()}). Spark's Lookups also checks at each task's first lookup.
     */
    Mapped acquire() {
        if (closed) {
            throw new ShmcacheException.Closed(name);
        }
        if (++untimed >= CLOCK_EVERY) {
            untimed = 0;
            long now = System.nanoTime();
            if (now - nextCheck >= 0) {
                nextCheck = now + FOLLOW_INTERVAL_NS;
                check();
            }
        }
        Mapped m = cur;
        if (m == null) {
            if (closed) {
                throw new ShmcacheException.Closed(name);
            }
            ShmcacheException.WrongOwner r = refused;
            if (r != null) {
                throw new ShmcacheException.WrongOwner(r);
            }
            throw new ShmcacheException.NotFound(name, "was destroyed (no " + path
                    + "); it is mapped again once it is re-created");
        }
        if (m.lost) {
            throw Mapped.cutShort(name, path, null);
        }
        return m;
    }

    /**
     * Looks at the file now (lookups do, at most every 0.1 s): a file cut short
     * marks the mapping lost (lookups then throw {@link ShmcacheException.Corrupt}) before
     * a read can fault on it, and for a handle attached by name, another file at the name
     * (a re-created cache) is mapped, nothing there drops the mapping.
     *
     * <p>Why the size is watched: a read of a page the file lost raises SIGBUS, which the
     * JVM turns into an {@link InternalError}. The reader catches it, but in JIT-compiled
     * code Java 17 leaves it pending and throws it at the thread's next safepoint, which
     * may be outside this package; a lookup that races a truncation within 0.1 s of this
     * check can therefore fail its caller with that InternalError (never a crash; Spark
     * fails the task, and its retry gets the error naming the cache).
     */
    public synchronized void check() {
        BasicFileAttributes a = Mapped.at(path);
        Object there = a == null ? null : a.fileKey();
        Mapped m = cur;
        if (closed) {
            return;
        }
        if (m != null && m.fileKey.equals(there)) {
            if (a.size() < m.map.size) {
                m.lost = true;
            }
            return;
        }
        if (!follow || (m == null && there == null)) {
            refused = null; // the refused file is gone too: nothing at the name
            return;
        }
        Mapped next = null;
        if (there != null) {
            try {
                next = Mapped.open(name, path, owner);
            } catch (ShmcacheException.WrongOwner e) {
                refused = e; // another user's file at the name: nothing of it is read, lookups say so
                cur = null;
                comp = null;
                return;
            } catch (ShmcacheException e) {
                return; // a damaged or half-gone file: keep what is mapped, look again later
            }
        }
        refused = null;
        cur = next;
        comp = next == null ? null : Companion.open(name, next.creationId, owner);
    }

    /** Counts a finished call in the handle and in the companion. */
    void count(long h, long m, long r, long c) {
        hits.addAndGet(h);
        misses.addAndGet(m);
        retries.addAndGet(r);
        corruptions.addAndGet(c);
        Companion k = comp;
        if (k != null) {
            k.add(h, m, r, c);
        }
    }

    void warn(long bucket, String what) {
        if (warned.add(bucket)) {
            LOG.log(System.Logger.Level.WARNING, "shmcache: cache ''{0}'': bucket {1} {2}", name, Long.toString(bucket), what);
        }
    }

    ShmcacheException cutShort(Mapped m, InternalError e) {
        m.lost = true;
        return Mapped.cutShort(name, path, e);
    }
}
