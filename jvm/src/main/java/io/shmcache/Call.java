package io.shmcache;

import static io.shmcache.Layout.*;

import java.lang.invoke.VarHandle;

/**
 * One lookup call of one thread over any number of keys (docs/segment-format.md, sections
 * 7-11): each key's bucket is read between two acquire loads of its seqlock version and
 * the read kept only if the version was even (or is a dead writer's, or damage, accepted as
 * it stands) and did not move. Every read is bounded by the geometry read at attach, so no
 * byte pattern makes a read leave the mapping; a damaged slot or record is a miss and a
 * counted corruption, never an error.
 *
 * <p>The stuck bound is per call (format section 7): the first time a call finds a bucket
 * stuck (mid-write under a live lock holder, or a version that keeps moving), it sets its
 * deadline STUCK_GIVE_UP (1 s) from then; before it, a stuck key is read again; from it on,
 * a key whose bucket is stuck is given up at once, a miss and one counted corruption. So a
 * call of any number of keys waits at most about 1 s in all. A call is what lies between
 * two {@link #flush()}es: the deadline is set again after each.
 *
 * <p>Every public method ends, inside its own {@code try}, with {@link Faults#seal()}
 * ({@link Faults}): a file cut short under the mapping is {@link ShmcacheException.Corrupt}
 * of the method that met it, never a JVM error thrown later elsewhere.
 *
 * <p>{@link #close()} (or {@link #flush()}) counts the call: hits, misses, retries and
 * corruptions in the handle and one batch in the readers' companion.
 */
public final class Call implements AutoCloseable {
    private static final int DONE = 0, STUCK = 1;
    private static final long MAX_ARRAY = Integer.MAX_VALUE - 8;

    private final Segment seg;
    private long hits, misses, retries, corruptions;
    private long deadline; // STUCK_GIVE_UP after this call first found a bucket stuck; 0: none yet
    private final java.util.TreeSet<Long> givenUp = new java.util.TreeSet<>(); // buckets given up in this call
    private long staticB = -1, staticV = -1; // a bucket accepted at an odd version, as it stands
    // the last probe's results
    private boolean bad;
    private long vlen;
    private byte[] value;

    Call(Segment seg) {
        this.seg = seg;
    }

    /** The value of the key at key[off..off+key_size] (a copy), null if not found. */
    public byte[] get(byte[] key, int off) {
        return lookup(key, off, key.length - off, true) ? value : null;
    }

    /** Whether the key at key[off..off+key_size] is present; no value is copied. */
    public boolean contains(byte[] key, int off) {
        return lookup(key, off, key.length - off, false);
    }

    /** Like {@link #get} for a key of {@code len} bytes at off (len must be the key size). */
    public byte[] get(byte[] key, int off, int len) {
        return lookup(key, off, len, true) ? value : null;
    }

    /** Like {@link #contains} for a key of {@code len} bytes at off. */
    public boolean contains(byte[] key, int off, int len) {
        return lookup(key, off, len, false);
    }

    /** Counts a key that was not looked up (a null key in Spark) as a miss of this call. */
    public void countMiss() {
        misses++;
    }

    /** Keys looked up since the last flush. */
    public long pending() {
        return hits + misses;
    }

    /** Counts what was looked up so far as one call and starts a new one. */
    public void flush() {
        if (hits + misses > 0) {
            seg.count(hits, misses, retries, corruptions);
        }
        if (!givenUp.isEmpty()) {
            seg.warnGivenUp(givenUp);
            givenUp.clear();
        }
        hits = misses = retries = corruptions = 0;
        deadline = 0;
        staticB = staticV = -1;
    }

    @Override
    public void close() {
        flush();
    }

    private boolean lookup(byte[] key, int off, int len, boolean want) {
        Mapped m = seg.acquire();
        try {
            if (len != m.keySize) {
                throw new ShmcacheException.KeySize(seg.name(), "a key of " + len + " bytes; this cache's keys are "
                        + m.keySize + " bytes");
            }
            try {
                boolean found = find(m, XXH64.hash(key, off, len, 0L), key, off, want);
                Faults.seal();
                return found;
            } catch (InternalError e) {
                throw seg.cutShort(m, e);
            }
        } finally {
            seg.release(m);
        }
    }

    /** The lookup of a key of the right size whose hash is h, in mapping m. */
    private boolean find(Mapped m, long h, byte[] key, int off, boolean want) {
        long b = h & (NBUCKETS - 1);
        boolean found = false;
        value = null;
        while (true) {
            if (readKey(m, h, b, key, off, want) == DONE) {
                found = value != null || vlen >= 0;
                break;
            }
            long now = System.nanoTime();
            // every call returns in one bound: past it, a stuck key is given up at once, before
            // the look at its lock's holder (a system call: 200,000 keys over held buckets took
            // 24 s when each made it, 120 us a key)
            if (deadline != 0 && now - deadline >= 0) {
                givenUp.add(b); // told once a call, at its flush
                corruptions++; // the key: a miss
                value = null;
                break;
            }
            if (stuckBucket(m, b)) {
                continue; // accepted as it stands (damage, or a dead writer's): read again
            }
            if (deadline == 0) {
                deadline = now + STUCK_GIVE_UP_NS; // the call's one wait on stuck buckets starts now
            }
            Thread.yield();
        }
        if (found) {
            hits++;
        } else {
            misses++;
        }
        return found;
    }

    /**
     * Each key's value in out[i] (a copy), null where not found or the key is null: keys[0..n)
     * looked up in stages so that their cache misses overlap. Every key is hashed; then a
     * stage of keys at a time has its lines brought into cache together ({@link Stages}:
     * bucket versions and home index slots, then the records they point to), and each key
     * is read as {@link #get} reads it, under its bucket's seqlock, from lines now in cache.
     * A key of the wrong size throws {@link ShmcacheException.KeySize} before any key is
     * read ({@link #badKey()} is then its index, for the caller's message). A null key is a
     * miss. {@link #getPacked} does the same without an array per key or per value.
     */
    public void getBatch(byte[][] keys, int n, byte[][] out) {
        batch(keys, n, out, null);
    }

    /** Like {@link #getBatch} for presence only: out[i] whether keys[i] is present; no value is copied. */
    public void containsBatch(byte[][] keys, int n, boolean[] out) {
        batch(keys, n, null, out);
    }

    /**
     * Like {@link #getBatch} over n keys laid end to end in {@code keys} (key i at
     * i * key_size; the array must hold n * key_size bytes exactly, or more), every value
     * copied into {@code out}'s one buffer: a batch allocates nothing per key. isNull[i]
     * (isNull may be null: no null keys) marks a null key, a miss.
     */
    public void getPacked(byte[] keys, boolean[] isNull, int n, Values out) {
        Mapped m = seg.acquire();
        try {
            packed(m, keys, n);
            out.reset(n);
            into = out;
            run(m, keys, isNull, n, null, null);
        } finally {
            into = null;
            seg.release(m);
        }
    }

    /** Like {@link #getPacked} for presence only: out[i] whether key i is present; no value is copied. */
    public void containsPacked(byte[] keys, boolean[] isNull, int n, boolean[] out) {
        Mapped m = seg.acquire();
        try {
            packed(m, keys, n);
            run(m, keys, isNull, n, null, out);
        } finally {
            seg.release(m);
        }
    }

    private void packed(Mapped m, byte[] keys, int n) {
        if (n < 0 || (long) n * m.keySize > keys.length) {
            throw new ShmcacheException.KeySize(seg.name(), n + " keys of " + m.keySize + " bytes in an array of "
                    + keys.length + " bytes; this cache's keys are " + m.keySize + " bytes");
        }
    }

    /** The key of the last batch that was the wrong size (its index), or -1. */
    public int badKey() {
        return badKey;
    }

    private int badKey = -1;
    private long[] hashes = new long[0];
    private byte[] flat = new byte[0];     // getBatch's keys laid end to end
    private boolean[] nulls = new boolean[0];
    private Values into;                   // getPacked's values, null: a new array per value
    private final Stages stages = new Stages();

    private void batch(byte[][] keys, int n, byte[][] vals, boolean[] has) {
        Mapped m = seg.acquire();
        try {
            int ks = m.keySize;
            badKey = -1;
            for (int i = 0; i < n; i++) {
                if (keys[i] != null && keys[i].length != ks) {
                    badKey = i;
                    throw new ShmcacheException.KeySize(seg.name(), "a key of " + keys[i].length
                            + " bytes; this cache's keys are " + ks + " bytes");
                }
            }
            if (nulls.length < n || flat.length < n * ks) {
                nulls = new boolean[Math.max(n, 64)];
                flat = new byte[Math.max(n, 64) * ks];
            }
            for (int i = 0; i < n; i++) {
                nulls[i] = keys[i] == null;
                if (!nulls[i]) {
                    System.arraycopy(keys[i], 0, flat, i * ks, ks);
                }
            }
            run(m, flat, nulls, n, vals, has);
        } finally {
            seg.release(m);
        }
    }

    /**
     * Hashes keys[0 .. n * key_size) and looks them up, a stage of keys at a time; the call's
     * end is {@link Faults#seal()}, inside the same {@code try} as every read.
     */
    private void run(Mapped m, byte[] keys, boolean[] isNull, int n, byte[][] vals, boolean[] has) {
        int ks = m.keySize;
        if (hashes.length < n) {
            hashes = new long[Math.max(n, 64)];
        }
        long[] hs = hashes;
        for (int i = 0; i < n; i++) {
            hs[i] = isNull != null && isNull[i] ? 0 : XXH64.hash(keys, i * ks, ks, 0L);
        }
        try {
            for (int lo = 0; lo < n; lo += Stages.STAGE) { // a stage's lines must still be in cache when its keys are read
                stages(m, keys, isNull, lo, Math.min(n, lo + Stages.STAGE), vals, has);
            }
            Faults.seal();
        } catch (InternalError e) {
            throw seg.cutShort(m, e);
        }
    }

    private void stages(Mapped m, byte[] keys, boolean[] isNull, int lo, int hi, byte[][] vals, boolean[] has) {
        boolean want = vals != null || into != null;
        stages.touch(m, hashes, lo, hi, want);
        int ks = m.keySize;
        long longest = -1;
        for (int i = lo; i < hi; i++) { // stage 3: each key under its seqlock, from lines in cache
            boolean f = false;
            if (isNull != null && isNull[i]) {
                misses++;
            } else {
                f = find(m, hashes[i], keys, i * ks, want);
            }
            if (f && want) {
                longest = Math.max(longest, vlen);
            }
            if (into != null) {
                if (f) {
                    into.found(i, (int) vlen);
                } else {
                    into.missing(i);
                }
            } else if (vals != null) {
                vals[i] = f ? value : null;
            } else {
                has[i] = f;
            }
        }
        if (longest >= 0) {
            stages.longest(longest);
        }
    }

    /** DONE with vlen >= 0 for a hit (and value set when want), -1 for a miss; or STUCK. */
    private int readKey(Mapped m, long h, long b, byte[] key, int off, boolean want) {
        long ver = m.metaWord(b, M_VERSION);
        for (int spins = 0;;) {
            long v1 = m.map.getLongAcquire(ver);
            if ((v1 & 1) != 0 && !(b == staticB && v1 == staticV)) {
                // past the call's bound, a bucket mid-write is stuck at once: no spinning on it
                // (SPIN_LIMIT spins a key were 10 s for 200,000 keys over held buckets)
                if (++spins >= Reader.SPIN_LIMIT || spins == 1 && deadline != 0 && System.nanoTime() - deadline >= 0) {
                    return STUCK;
                }
                Thread.onSpinWait();
                continue;
            }
            bad = false;
            long hit = probe(m, h, b, key, off);
            byte[] v = null;
            if (want && hit >= 0) {
                if (vlen > MAX_ARRAY) {
                    throw new ShmcacheException.Corrupt(seg.name(), null, "a value of " + vlen
                            + " bytes does not fit a Java array", null);
                }
                if (into != null) { // copied before the second load of the version, as is a new array
                    int at = into.reserve(seg.name(), vlen); // grows data(): asked for after it
                    m.map.copy(hit, into.data(), at, (int) vlen);
                } else {
                    v = new byte[(int) vlen];
                    m.map.copy(hit, v, 0, (int) vlen);
                }
            }
            VarHandle.acquireFence();
            if (m.map.getLongAcquire(ver) == v1) {
                if (bad && (v1 & 1) == 0) {
                    corruptions++;
                }
                if (hit < 0) {
                    vlen = -1;
                }
                value = v;
                return DONE;
            }
            retries++;
            if (++spins >= Reader.SPIN_LIMIT) {
                return STUCK;
            }
        }
    }

    /**
     * The key's probe path (sections 9-11): the file position of its value (vlen set), or
     * -1; {@code bad} set if a slot of its tag or a record of its hash was damaged.
     */
    private long probe(Mapped m, long h, long b, byte[] key, int off) {
        long slots = m.slots, ring = m.ring;
        int ks = m.keySize;
        long lim = ring - RECORD_HEADER - ks; // a record header and key fit from an offset <= lim
        long mask = slots - 1;
        long ibase = FIXED_BYTES + b * slots * WORD, rbase = m.ringOff + b * ring;
        long tag = h >>> TAG_SHIFT;
        long sl = (h >>> BUCKET_BITS) & mask;
        for (long i = 0; i < slots; i++) {
            long e = m.map.getLong(ibase + sl * WORD);
            if (e == 0) {
                break;
            }
            if ((e >> POS_BITS) == tag) {
                long o = (e & POS_MASK) - 1;
                if (o < 0 || o > lim || (o & (RECORD_ALIGN - 1)) != 0) {
                    bad = true;
                } else if (m.map.getLong(rbase + o) == h) {
                    long w = m.map.getLong(rbase + o + 8);
                    long ln = w & 0xFFFFFFFFL;
                    if ((w >> 32) != F_LIVE || ln > m.maxValue || o + RECORD_HEADER + ks + ln > ring) {
                        bad = true;
                    } else if (m.map.equalsAt(rbase + o + RECORD_HEADER, key, off, ks)) {
                        vlen = ln;
                        return rbase + o + RECORD_HEADER + ks;
                    }
                }
            }
            sl = (sl + 1) & mask;
        }
        return -1;
    }

    /**
     * A bucket that stayed mid-write (section 7, step 5): true if its odd version is accepted
     * as it stands (damage: no lock holder, one corruption; or a dead holder, nothing
     * counted), and the key is read again at once; false if a live writer is at work (or the
     * version moved): the bucket is stuck.
     */
    private boolean stuckBucket(Mapped m, long b) {
        long ver = m.metaWord(b, M_VERSION), lock = m.metaWord(b, M_LOCK);
        long v = m.map.getLongAcquire(ver);
        long owner = m.map.getLongAcquire(lock);
        if ((v & 1) != 0 && m.map.getLongAcquire(ver) == v) {
            if (owner == 0) {
                if (b != staticB || v != staticV) {
                    corruptions++;
                    seg.warn(b, "is mid-write (version " + v + ") with no writer holding its lock: damage, read as it stands");
                }
                staticB = b;
                staticV = v;
                return true;
            }
            if (!m.writerAlive(owner) && m.map.getLongAcquire(lock) == owner) { // only its own odd version
                staticB = b;
                staticV = v;
                return true;
            }
        }
        return false;
    }
}
