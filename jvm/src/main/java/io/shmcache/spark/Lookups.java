package io.shmcache.spark;

import io.shmcache.Call;
import io.shmcache.Owner;
import io.shmcache.Segment;
import io.shmcache.ShmcacheException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.TaskContext;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * What the Spark SQL functions call, row by row, inside an executor's JVM (the same code
 * for the Catalyst expression and the Java UDF): one read-only {@link Segment} per cache
 * per JVM, attached at its first lookup and shared by every task; each task thread looks
 * keys up in its own {@link Call}, counted in the readers' companion as one batch every
 * {@code FLUSH_EVERY} keys and at the task's end (so `shmcache stats` sees them when the
 * job is done). A null key is a miss. At a task's first lookup the handle looks at the
 * name (a re-created cache is mapped again, a file cut short is an error).
 *
 * <p>With an owner (the 3-argument SQL functions), the handle is attached with
 * {@link Segment#attach(String, io.shmcache.Owner)}: a cache whose file another user owns
 * fails the task with {@link ShmcacheException.WrongOwner} naming both users, at its first
 * attach and at every re-attach, before anything of it is read. A handle per (cache, owner).
 *
 * <p>Errors fail the task with a message naming what was wrong: a cache missing on this
 * host (every machine that runs executors needs its own `shmcache run`), a key of the
 * wrong length or not hex, naming the key column.
 */
public final class Lookups {
    private Lookups() {}

    static final int FLUSH_EVERY = 4096;
    static final String WHO = "shmcache.spark.lookup";
    private static final Map<String, Segment> HANDLES = new ConcurrentHashMap<>();
    private static final ThreadLocal<Tally> TALLY = ThreadLocal.withInitial(Tally::new);

    /** A task thread's calls, one per cache; flushed every FLUSH_EVERY keys and at the task's end. */
    private static final class Tally {
        final Map<String, Call> calls = new HashMap<>();
        long task = Long.MIN_VALUE;
        long rows; // keys this task looked up so far: the row an error names
        boolean inTask; // false: the driver evaluates the plan itself (a local table's projection)
        UTF8String lastName, lastOwner;
        Call last;
        Segment lastSeg;

        void flushAll() {
            for (Call c : calls.values()) {
                c.flush();
            }
        }
    }

    /** The value of a raw key (binary), null where not found or the key is null. */
    public static byte[] get(UTF8String cache, byte[] key, UTF8String column) {
        return get(cache, key, column, null);
    }

    /** {@link #get} from a cache that must belong to {@code owner} (a user name or uid; null: any). */
    public static byte[] get(UTF8String cache, byte[] key, UTF8String column, UTF8String owner) {
        Call c = call(cache, owner);
        if (key == null) {
            c.countMiss();
            done(c);
            return null;
        }
        try {
            byte[] v = c.get(key, 0, key.length);
            done(c);
            return v;
        } catch (ShmcacheException e) {
            throw explain(e, cache, column, key);
        }
    }

    /** Whether a raw key is present; false for a null key. */
    public static boolean contains(UTF8String cache, byte[] key, UTF8String column) {
        return contains(cache, key, column, null);
    }

    /** {@link #contains} in a cache that must belong to {@code owner} (null: any). */
    public static boolean contains(UTF8String cache, byte[] key, UTF8String column, UTF8String owner) {
        Call c = call(cache, owner);
        if (key == null) {
            c.countMiss();
            done(c);
            return false;
        }
        try {
            boolean v = c.contains(key, 0, key.length);
            done(c);
            return v;
        } catch (ShmcacheException e) {
            throw explain(e, cache, column, key);
        }
    }

    /** {@link #get} for a key given as 2 * key_size hex digits (either case). */
    public static byte[] getHex(UTF8String cache, UTF8String key, UTF8String column) {
        return getHex(cache, key, column, null);
    }

    /** {@link #getHex} from a cache that must belong to {@code owner} (null: any). */
    public static byte[] getHex(UTF8String cache, UTF8String key, UTF8String column, UTF8String owner) {
        return key == null ? get(cache, null, column, owner) : get(cache, unhex(cache, key, column, owner), column, owner);
    }

    /** {@link #contains} for a key given as hex digits. */
    public static boolean containsHex(UTF8String cache, UTF8String key, UTF8String column) {
        return containsHex(cache, key, column, null);
    }

    /** {@link #containsHex} in a cache that must belong to {@code owner} (null: any). */
    public static boolean containsHex(UTF8String cache, UTF8String key, UTF8String column, UTF8String owner) {
        return key == null ? contains(cache, null, column, owner)
                : contains(cache, unhex(cache, key, column, owner), column, owner);
    }

    private static byte[] unhex(UTF8String cache, UTF8String key, UTF8String column, UTF8String owner) {
        call(cache, owner);
        Tally t = TALLY.get();
        t.rows--; // counted again by the lookup of the parsed key
        int ks = t.lastSeg.keySize();
        String s = key.toString();
        if (s.length() != 2 * ks) {
            throw keyError(cache, column, "key " + show(s) + " is " + s.length() + " hex characters; keys of this "
                    + "cache are " + 2 * ks + " hex characters");
        }
        try {
            return HexFormat.of().parseHex(s);
        } catch (IllegalArgumentException e) {
            throw keyError(cache, column, "key " + show(s) + " is not " + 2 * ks + " hex characters");
        }
    }

    /** A key error worded as the Python lookup's (_keys.py); the "batch" is this task's partition. */
    private static ShmcacheException.KeySize keyError(UTF8String cache, UTF8String column, String what) {
        return new ShmcacheException.KeySize(cache.toString(), WHO + " (cache '" + cache + "'): key column '" + column
                + "', row " + (TALLY.get().rows - 1) + " of this batch: " + what, true);
    }

    /** {@link #keyError} for a row counted by the caller (the batched lookup, {@link BatchLookups}). */
    static ShmcacheException.KeySize keyError(String cache, String column, long row, String what) {
        return new ShmcacheException.KeySize(cache, WHO + " (cache '" + cache + "'): key column '" + column
                + "', row " + row + " of this batch: " + what, true);
    }

    static String show(String s) {
        return "'" + (s.length() > 80 ? s.substring(0, 80) + "..." : s) + "'";
    }

    /** This thread's call on the cache, attaching it at its first use in this JVM. */
    private static Call call(UTF8String cache, UTF8String owner) {
        Tally t = TALLY.get();
        TaskContext ctx = TaskContext.get();
        long task = ctx == null ? driverQuery() : ctx.taskAttemptId();
        t.inTask = ctx != null;
        if (task != t.task) { // a new task on this thread: count the last one's keys, watch this one's end
            t.flushAll();
            t.calls.clear();
            t.lastName = null;
            t.task = task;
            t.rows = 0;
            if (ctx != null) {
                Tally mine = t;
                ctx.addTaskCompletionListener((org.apache.spark.util.TaskCompletionListener) done -> mine.flushAll());
            }
        }
        if (cache == null) {
            throw new IllegalArgumentException("shmcache: the cache name is null");
        }
        if (!cache.equals(t.lastName) || !(owner == null ? t.lastOwner == null : owner.equals(t.lastOwner))) {
            String name = cache.toString(), who = owner == null ? null : owner.toString();
            String id = handleId(name, who);
            Call c = t.calls.get(id);
            Segment seg = handle(name, who);
            if (c == null) {
                seg.check(); // the task's first look at the name
                c = seg.call();
                t.calls.put(id, c);
            }
            t.lastName = cache.clone();
            t.lastOwner = owner == null ? null : owner.clone();
            t.last = c;
            t.lastSeg = seg;
        }
        Call c = t.last;
        t.rows++;
        if (c.pending() >= FLUSH_EVERY) {
            c.flush();
        }
        return c;
    }

    /**
     * Outside a task (the driver folds a projection of a local table while it plans the
     * query): the query's execution id stands for the task, and each key is counted at once.
     */
    private static long driverQuery() {
        scala.Option<org.apache.spark.sql.SparkSession> s = org.apache.spark.sql.SparkSession.getActiveSession();
        String id = s.isDefined() ? s.get().sparkContext().getLocalProperty("spark.sql.execution.id") : null;
        try {
            return id == null ? Long.MIN_VALUE : -2 - Long.parseLong(id);
        } catch (NumberFormatException e) {
            return Long.MIN_VALUE;
        }
    }

    private static void done(Call c) {
        if (!TALLY.get().inTask) {
            c.flush();
        }
    }

    /** The key of a handle (and of a task's call): the cache, and the owner it must have. */
    private static String handleId(String name, String owner) {
        return owner == null ? name : name + '\0' + owner;
    }

    static Segment handle(String name, String owner) {
        String id = handleId(name, owner);
        Segment s = HANDLES.get(id);
        if (s != null) {
            return s;
        }
        try {
            return HANDLES.computeIfAbsent(id, k -> Segment.attach(name, owner == null ? null : Owner.of(name, owner)));
        } catch (ShmcacheException.NotFound e) {
            throw missing(name, e);
        }
    }

    private static RuntimeException explain(ShmcacheException e, UTF8String cache, UTF8String column, byte[] key) {
        String name = cache.toString();
        if (e instanceof ShmcacheException.NotFound) {
            Tally t = TALLY.get();
            String id = handleId(name, t.lastOwner == null ? null : t.lastOwner.toString());
            HANDLES.remove(id); // attached again at the next lookup; not closed: other tasks may hold it
            t.calls.remove(id);
            t.lastName = null;
            return missing(name, e);
        }
        if (e instanceof ShmcacheException.KeySize) {
            String k = HexFormat.of().formatHex(key, 0, Math.min(key.length, 40)) + (key.length > 40 ? "..." : "");
            return keyError(cache, column, "key " + k + " is " + key.length + " bytes; keys of this cache are "
                    + TALLY.get().lastSeg.keySize() + " bytes");
        }
        return e;
    }

    /** A handle dropped after its cache was found gone: attached again at the next lookup (not closed: others may hold it). */
    static void forget(String name, String owner) {
        HANDLES.remove(handleId(name, owner));
    }

    static ShmcacheException.NotFound missing(String name, Exception cause) {
        return new ShmcacheException.NotFound(name, WHO + ": cache '" + name + "' not found on host " + describeHost()
                + " (/dev/shm/" + name + "); every machine that runs executors needs its own `shmcache run --name "
                + name + " ...` (see docs/spark.md)", true);
    }

    /** The machine as shmcache names it ($SHMCACHE_MACHINE, else the host name), as machine.describe(). */
    static String describeHost() {
        String host;
        try {
            host = Files.readString(Path.of("/proc/sys/kernel/hostname"), StandardCharsets.UTF_8).trim();
        } catch (IOException e) {
            host = "localhost";
        }
        String m = System.getenv("SHMCACHE_MACHINE");
        if (m == null || m.isEmpty() || m.equals(host)) {
            return "'" + host + "'";
        }
        return "'" + m + "' (host '" + host + "')";
    }

    /** Counts this thread's pending lookups now (tests, and callers outside tasks). */
    public static void flush() {
        TALLY.get().flushAll();
    }
}
