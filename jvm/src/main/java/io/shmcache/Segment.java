package io.shmcache;

import static io.shmcache.Layout.*;

import java.nio.file.Path;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;
import java.util.regex.Pattern;

/**
 * A read-only handle on one cache (docs/segment-format.md): {@link #attach(String)} maps
 * /dev/shm/NAME read-only after every check of section 4 and joins its readers'
 * companion; {@link #attachPath(Path)} maps a file anywhere (a golden segment), with no
 * companion and no following of a name. Safe for use by many threads; each
 * {@link Call} belongs to one thread.
 *
 * <p>Guarantees (docs/reader-contract.md; docs/jvm.md "Guarantees"):
 * <ul>
 * <li>It never hangs: no open blocks ({@link FileOpener}), and a call waits at most
 *     STUCK_GIVE_UP in all for buckets held mid-write ({@link Call}).
 * <li>It never dies: a file cut short under the mapping is {@link ShmcacheException.Corrupt}
 *     ("cut short") of the call that met it, on the calling thread, never a JVM error
 *     thrown elsewhere ({@link Faults}).
 * <li>It refuses what it was not told to trust: with an {@link Owner}, another user's file
 *     ({@link ShmcacheException.WrongOwner}); owner named or not, a file its group or others
 *     may write ({@link ShmcacheException.UnsafeMode}); before a byte of it is read.
 * <li>It serves nothing that is no longer there: a handle attached by name looks at the name
 *     at least every 0.1 s of use (every call reads the clock), and while the name holds
 *     anything but the file it maps, its lookups fail with what is there now
 *     ({@link ShmcacheException.NotFound} for nothing, that file's own error otherwise); a
 *     new cache at the name is mapped and served. While nothing usable is there, every call
 *     looks again.
 * <li>A readers' companion it cannot use (gone, cut short, another user's) turns the shared
 *     counters off; lookups go on ({@link Companion}).
 * </ul>
 * Not guaranteed (format section 17): an entry may be evicted at any time once its bucket
 * is full; a key set while it is read reads as the old or the new value, never a mix; stats
 * are a snapshot; a miss falls through to the store of record.
 *
 * <p>A mapping the handle drops (another file at the name, nothing there, a file cut short,
 * the handle closed) is unmapped at once, or as soon as the last call still reading it
 * returns: every call counts itself in and out of the mapping it reads ({@link Mapped#enter}),
 * so no thread reads an unmapped address.
 */
public final class Segment implements AutoCloseable {
    private static final Pattern NAME = Pattern.compile("[A-Za-z0-9][A-Za-z0-9._-]{0,199}");
    private static final System.Logger LOG = System.getLogger("io.shmcache");
    private static final long WAIT_POLL_MS = 50; // wait_ready's pace (format section 14)

    private final String name;
    private final Path path;
    private final boolean follow;
    private final Owner owner;           // null: any owner
    private volatile State state;
    private volatile boolean closed;
    private volatile long nextCheck;
    private final ReentrantLock looking = new ReentrantLock();
    final AtomicLong hits = new AtomicLong(), misses = new AtomicLong();
    final AtomicLong retries = new AtomicLong(), corruptions = new AtomicLong();
    private final Set<Long> warned = ConcurrentHashMap.newKeySet();

    /** What a handle serves now: a mapping (and its companion), or the error of what is at the name. */
    private record State(Mapped m, Companion comp, ShmcacheException error) {}

    private Segment(String name, Path path, boolean follow, Owner owner, Mapped m, ShmcacheException error) {
        this.name = name;
        this.path = path;
        this.follow = follow;
        this.owner = owner;
        this.state = m == null ? new State(null, null, error)
                : new State(m, follow ? Companion.open(name, m.creationId, owner) : null, null);
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
        Path p = pathOf(name);
        return new Segment(name, p, true, owner, Mapped.open(name, p, owner), null);
    }

    /**
     * A handle that follows cache {@code name} whatever is at the name now, as a long-running
     * service holds one: it never throws for what is at the name here; its lookups throw what
     * is there (nothing: {@link ShmcacheException.NotFound}) until a cache is, then serve it.
     * An invalid name is still {@link ShmcacheException.BadName}.
     */
    public static Segment follow(String name, Owner owner) {
        Path p = pathOf(name);
        Segment s = new Segment(name, p, true, owner, null, ThreadOpener.notFound(name, p, ""));
        s.check();
        return s;
    }

    private static Path pathOf(String name) {
        if (name == null || !NAME.matcher(name).matches()) {
            throw new ShmcacheException.BadName(String.valueOf(name), "not a valid cache name: use 1-200 letters, "
                    + "digits, '.', '_' or '-', starting with a letter or digit");
        }
        return Path.of(SHM_DIR, name);
    }

    /** Maps a segment's file anywhere: the same checks; no companion, no following. */
    public static Segment attachPath(Path path) {
        return attachPath(path, null);
    }

    /** {@link #attachPath(Path)} of a file that must belong to {@code owner} (null: any user). */
    public static Segment attachPath(Path path, Owner owner) {
        return new Segment(path.toString(), path, false, owner, Mapped.open(path.toString(), path, owner), null);
    }

    /**
     * How this JVM reads caches: its memory access, "unsafe" (JDK 17-21) or "memory-segment"
     * (JDK 22+), and its open, "open-nonblock" ({@code open(2)} with {@code O_NONBLOCK}: the
     * JDK's own on JDK 17-21, the foreign function API's on JDK 22+ where native access is
     * enabled) or "opener-thread" (elsewhere); e.g. "memory-segment open-nonblock".
     */
    public static String access() {
        return Jdk.memory() + " " + (FileOpener.INSTANCE instanceof ThreadOpener ? "opener-thread" : "open-nonblock");
    }

    /** The owner this handle insists on, null for any. */
    public Owner owner() {
        return owner;
    }

    public String name() {
        return name;
    }

    public int keySize() {
        Mapped m = acquire();
        release(m);
        return m.keySize;
    }

    public long creationId() {
        Mapped m = acquire();
        release(m);
        return m.creationId;
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

    /**
     * Stats (format section 15): the table's figures summed over buckets and writer rows, every
     * reader process's counts from the companion, and this handle's own. A snapshot.
     */
    public Stats stats() {
        State s = live();
        Mapped m = s.m;
        long entries, bytesUsed, evictions, takeovers, sets = 0, deletes = 0, writers = 0, writerCorruptions = 0;
        long createdNs;
        try {
            entries = m.sumMeta(M_LIVE);
            bytesUsed = m.sumMeta(M_LIVE_BYTES);
            evictions = m.sumMeta(M_EVICTIONS);
            takeovers = m.sumMeta(M_TAKEOVERS);
            for (long i = 0; i < MAX_WRITERS; i++) {
                long row = WRITERS_OFF + i * ROW_WORDS * WORD;
                writers += m.map.getLong(row + W_OWNER * WORD) != 0 ? 1 : 0;
                sets += m.map.getLong(row + W_SETS * WORD);
                deletes += m.map.getLong(row + W_DELETES * WORD);
                writerCorruptions += m.map.getLong(row + W_CORRUPTIONS * WORD);
            }
            createdNs = m.header(H_CREATED_NS);
            Faults.seal();
        } catch (InternalError e) {
            throw cutShort(m, e);
        } finally {
            release(m);
        }
        Companion c = s.comp;
        long[] t = c == null ? null : c.totals();
        long[] shared = t == null ? new long[5] : t;
        boolean own = c == null || !c.counting(); // this handle's corruptions are not in a row of the companion
        return new Stats(name, entries, bytesUsed, NBUCKETS * m.ring, NBUCKETS * (m.slots * MAX_LOAD_NUM / MAX_LOAD_DEN),
                m.map.size(), evictions, takeovers, sets, deletes, writers, hits.get(), misses.get(), retries.get(),
                shared[0], shared[1], shared[2], shared[3], shared[4],
                writerCorruptions + shared[3] + (own ? corruptions.get() : 0), m.keySize, m.maxValue, NBUCKETS,
                LAYOUT_VERSION, m.creationId, createdNs / 1e9);
    }

    /**
     * What {@link #stats()} returns: the fields of format section 15 and docs/reader-contract.md
     * ("stats"), in camel case. {@code hits}, {@code misses} and {@code readRetries} are this
     * handle's own lookups; the {@code reader*} figures sum every reader process's row of the
     * companion (0 without one); {@code corruptions} counts writers' and readers'.
     */
    public record Stats(String name, long entries, long bytesUsed, long capacityBytes, long maxEntries, long memory,
                        long evictions, long lockTakeovers, long sets, long deletes, long writers, long hits,
                        long misses, long readRetries, long readerHits, long readerMisses, long readerBatches,
                        long readerCorruptions, long readers, long corruptions, long keySize, long maxValue,
                        long buckets, long layoutVersion, long creationId, double createdS) {
        /** The contract's JSON object (snake-case field names), without the fields named in {@code without}. */
        public String toJson(String... without) {
            return Json.write(this, without);
        }
    }

    /**
     * Readiness and progress from the cache's control area (format section 14), by the rule
     * and with the fields of docs/reader-contract.md's status table.
     */
    public Status status() {
        Mapped m = acquire();
        try {
            Status st = Status.read(name, m);
            Faults.seal();
            return st;
        } catch (InternalError e) {
            throw cutShort(m, e);
        } finally {
            release(m);
        }
    }

    /**
     * Waits until the cache is ready (its whole topic applied here), polling its status every
     * 0.05 s, and returns that status; {@link ShmcacheException.NotReady} saying why not once
     * {@code timeoutSeconds} have passed (infinite: no bound). While nothing is at the name
     * (a cache being destroyed and created again) it goes on waiting; any other error ends it.
     */
    public Status waitReady(double timeoutSeconds) {
        return waitReady(timeoutSeconds, Status.Bound.NONE);
    }

    /**
     * Waits as {@link #waitReady(double)} does until the cache is ready and, besides, within
     * the bound: no partition more than its messages or seconds behind the topic
     * ({@link Status#beyond}).
     */
    public Status waitReady(double timeoutSeconds, Status.Bound bound) {
        long start = System.nanoTime();
        boolean interrupted = false;
        try {
            while (true) {
                Status st = null;
                try {
                    st = status();
                } catch (ShmcacheException.NotFound e) {
                    // being re-created: wait on
                }
                String over = st != null && st.ready() ? st.beyond(bound) : "";
                if (st != null && st.ready() && over.isEmpty()) {
                    return st;
                }
                if (interrupted || (System.nanoTime() - start) / 1e9 >= timeoutSeconds) {
                    throw new ShmcacheException.NotReady(name, "shmcache: cache '" + name + "' not ready after "
                            + Status.fixed(timeoutSeconds, 1) + " s: " + (st != null ? (over.isEmpty() ? st.why() : over)
                            : "it does not exist (no " + path + ")") + (interrupted ? " (interrupted)" : ""), st);
                }
                try {
                    Thread.sleep(WAIT_POLL_MS);
                } catch (InterruptedException e) {
                    interrupted = true;
                }
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /** Unmaps (at once, or when the last call still reading returns); never destroys. Idempotent. */
    @Override
    public void close() {
        closed = true;
        State old = state;
        state = new State(null, null, new ShmcacheException.Closed(name));
        if (old.m != null) {
            old.m.retire();
        }
    }

    /** The mapping to read now ({@link #live()}), entered: the caller must {@link #release} it. */
    Mapped acquire() {
        return live().m;
    }

    /** A call has done reading m (it was {@link #acquire}d). */
    void release(Mapped m) {
        m.exit();
    }

    /**
     * What to serve now, its mapping entered (the caller reads it, then releases it): every
     * call reads the clock, and at least every 0.1 s one looks at the name ({@link #check()});
     * while nothing usable is there, every call looks. Throws what is at the name when that is
     * not a usable cache, and {@link ShmcacheException.Corrupt} for a file cut short under the
     * mapping.
     */
    private State live() {
        while (true) {
            State s = state;
            if (closed) {
                throw new ShmcacheException.Closed(name);
            }
            if (s.m == null || System.nanoTime() - nextCheck >= 0) {
                check();
                s = state;
                if (closed) {
                    throw new ShmcacheException.Closed(name);
                }
            }
            if (s.m == null) {
                throw s.error.again();
            }
            if (s.m.lost) {
                throw Mapped.cutShort(name, path, null);
            }
            if (s.m.enter()) {
                return s;
            }
            // dropped by another thread's look since: what it put in its place is read next
        }
    }

    /**
     * Looks at the name now (lookups do, at least every 0.1 s), unless another thread is
     * looking already: then it returns at once, and this thread serves what is mapped now
     * (a look that re-attaches never holds up other threads' lookups). The same file at the
     * name: a file shorter than its mapping marks it lost (lookups then throw
     * {@link ShmcacheException.Corrupt}). For a handle attached by name, anything else at the
     * name drops the mapping at once: nothing there makes lookups throw
     * {@link ShmcacheException.NotFound}; a new cache is mapped (every check of section 4
     * again, the owner's too); any other file makes them throw its error while it is there.
     */
    public void check() {
        if (!looking.tryLock()) {
            return;
        }
        try {
            look();
        } finally {
            looking.unlock();
        }
    }

    private void look() {
        nextCheck = System.nanoTime() + FOLLOW_INTERVAL_NS;
        State s = state;
        if (closed) {
            return;
        }
        FileStat at = FileStat.identity(path);
        // the file mapped, its mode still safe (a chmod letting others write it is a change:
        // it is opened again, and the mode check refuses it until its mode is safe again)
        if (s.m != null && s.m.stat.sameFile(at) && !(follow && at.unsafeMode())) {
            if (at.size() < s.m.map.size()) {
                s.m.lost = true;
                s.m.retire();
            }
            return;
        }
        if (!follow && s.m != null) {
            return; // a file mapped by path is read for as long as the handle lives
        }
        if (at == null) {
            if (s.m != null || !(s.error instanceof ShmcacheException.NotFound)) {
                replace(s, new State(null, null, follow ? ThreadOpener.notFound(name, path, "")
                        : new ShmcacheException.NotFound(name, "does not exist (no " + path + ")")));
            }
            return;
        }
        State next;
        try {
            Mapped m = Mapped.open(name, path, owner);
            next = new State(m, follow ? Companion.open(name, m.creationId, owner) : null, null);
        } catch (ShmcacheException e) {
            next = new State(null, null, e);
        }
        if (closed) {
            if (next.m != null) {
                next.m.retire();
            }
            return;
        }
        replace(s, next);
    }

    /** The handle serves next from now on; the mapping it served is dropped (unmapped once no call reads it). */
    private void replace(State old, State next) {
        state = next;
        if (old.m != null) {
            old.m.retire();
        }
    }

    /** Counts a finished call in the handle and in the companion. */
    void count(long h, long m, long r, long c) {
        hits.addAndGet(h);
        misses.addAndGet(m);
        retries.addAndGet(r);
        corruptions.addAndGet(c);
        Companion k = state.comp;
        if (k != null) {
            k.add(h, m, r, c);
        }
    }

    /**
     * Logs, in one line a call, the buckets given up in it that this handle had not logged
     * before (the first 8 named), as the Python and Go readers word it.
     */
    void warnGivenUp(java.util.Collection<Long> buckets) {
        java.util.List<String> fresh = new java.util.ArrayList<>();
        int n = 0;
        for (long b : buckets) {
            if (warned.add(b) && ++n <= 8) {
                fresh.add(Long.toString(b));
            }
        }
        if (n > 0) {
            LOG.log(System.Logger.Level.WARNING, "shmcache: cache ''{0}'': {1} bucket(s) stayed mid-write or kept "
                    + "changing for 1 s ({2}{3}); their keys are reported missing for this call", name,
                    Integer.toString(n), String.join(", ", fresh), n > 8 ? ", ..." : "");
        }
    }

    void warn(long bucket, String what) {
        if (warned.add(bucket)) {
            LOG.log(System.Logger.Level.WARNING, "shmcache: cache ''{0}'': bucket {1} {2}", name, Long.toString(bucket), what);
        }
    }

    /**
     * The error of a call whose read of m faulted: the file was cut short under the mapping
     * (m is lost from now on). Anything but the JVM's report of a fault is thrown as it is.
     */
    ShmcacheException cutShort(Mapped m, InternalError e) {
        if (!Faults.isFault(e)) {
            throw e;
        }
        m.lost = true;
        m.retire();
        return Mapped.cutShort(name, path, e);
    }
}
