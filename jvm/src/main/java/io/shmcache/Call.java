package io.shmcache;

import static io.shmcache.Layout.*;

import java.lang.invoke.VarHandle;

/**
 * One lookup call of one thread over any number of keys (docs/segment-format.md, sections
 * 7-11): each key's bucket is read between two acquire loads of its seqlock version and
 * the read kept only if the version was even (or is a dead writer's, or damage, accepted as
 * it stands) and did not move. Every read is bounded by the geometry read at attach, so no
 * byte pattern makes a read leave the mapping; a damaged slot or record is a miss and a
 * counted corruption, never an error. A bucket stuck mid-write is waited for at most
 * STUCK_GIVE_UP (1 s) per call, then given up for the rest of the call.
 *
 * <p>{@link #close()} (or {@link #flush()}) counts the call: hits, misses, retries and
 * corruptions in the handle and one batch in the readers' companion.
 */
public final class Call implements AutoCloseable {
    private static final int DONE = 0, STUCK = 1;
    private static final long MAX_ARRAY = Integer.MAX_VALUE - 8;

    private final Segment seg;
    private long hits, misses, retries, corruptions;
    private long[] givenUp = new long[4];
    private int nGivenUp;
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
        hits = misses = retries = corruptions = 0;
        nGivenUp = 0;
        staticB = staticV = -1;
    }

    @Override
    public void close() {
        flush();
    }

    private boolean lookup(byte[] key, int off, int len, boolean want) {
        Mapped m = seg.acquire();
        if (len != m.keySize) {
            throw new ShmcacheException.KeySize(seg.name(), "a key of " + len + " bytes; this cache's keys are "
                    + m.keySize + " bytes");
        }
        return find(m, Segment.XXH64.hash(key, off, len, 0L), key, off, want);
    }

    /** The lookup of a key of the right size whose hash is h, in mapping m. */
    private boolean find(Mapped m, long h, byte[] key, int off, boolean want) {
        long b = h & (NBUCKETS - 1);
        boolean found = false;
        value = null;
        try {
            long stuckSince = 0;
            for (boolean waited = false;; waited = true) {
                if (readKey(m, h, b, key, off, want) == DONE) {
                    found = value != null || vlen >= 0;
                    break;
                }
                long now = System.nanoTime();
                if (!waited) {
                    stuckSince = now;
                }
                if (isGivenUp(b) || now - stuckSince > STUCK_GIVE_UP_NS) { // every call returns in a bound
                    giveUp(b);
                    seg.warn(b, "stayed mid-write or kept changing for 1 s; its keys are reported missing for this call");
                    corruptions++; // the key: a miss
                    value = null;
                    break;
                }
                stuckBucket(m, b);
            }
        } catch (InternalError e) {
            throw seg.cutShort(m, e);
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
     * looked up in stages so that their cache misses overlap (a row at a time, each key's
     * index slot and then its record are two dependent misses, none overlapped). First every
     * key is hashed; then every key's bucket version and home index slot are loaded (n
     * independent loads the CPU keeps in flight together); then, through the slots now in
     * cache, the record of the first slot with each key's tag is touched; then each key is
     * read as {@link #get} reads it, under its bucket's seqlock, from lines now in cache. The
     * touching loads are hints read outside the seqlock, bounded as every read is: their
     * values are never used, so a write racing them changes nothing returned. A key of the
     * wrong size throws {@link ShmcacheException.KeySize} before any key is read
     * ({@link #badKey()} is then its index, for the caller's message). A null key is a miss.
     */
    public void getBatch(byte[][] keys, int n, byte[][] out) {
        batch(keys, n, out, null);
    }

    /** Like {@link #getBatch} for presence only: out[i] whether keys[i] is present; no value is copied. */
    public void containsBatch(byte[][] keys, int n, boolean[] out) {
        batch(keys, n, null, out);
    }

    /** The key of the last batch that was the wrong size (its index), or -1. */
    public int badKey() {
        return badKey;
    }

    private int badKey = -1;
    private long[] hashes = new long[0];
    private long sink; // the touching loads' values land here, so the compiler keeps them

    private void batch(byte[][] keys, int n, byte[][] vals, boolean[] has) {
        Mapped m = seg.acquire();
        int ks = m.keySize;
        badKey = -1;
        for (int i = 0; i < n; i++) {
            if (keys[i] != null && keys[i].length != ks) {
                badKey = i;
                throw new ShmcacheException.KeySize(seg.name(), "a key of " + keys[i].length
                        + " bytes; this cache's keys are " + ks + " bytes");
            }
        }
        if (hashes.length < n) {
            hashes = new long[Math.max(n, 64)];
        }
        long[] hs = hashes;
        for (int i = 0; i < n; i++) {
            hs[i] = keys[i] == null ? 0 : Segment.XXH64.hash(keys[i], 0, ks, 0L);
        }
        for (int lo = 0; lo < n; lo += STAGE) { // a stage's lines must still be in cache when its keys are read
            stages(m, keys, lo, Math.min(n, lo + STAGE), vals, has);
        }
    }

    private void stages(Mapped m, byte[][] keys, int lo, int hi, byte[][] vals, boolean[] has) {
        long[] hs = hashes;
        int ks = m.keySize;
        long slots = m.slots, ring = m.ring, mask = slots - 1, s = 0;
        long lim = ring - RECORD_HEADER - ks;
        try {
            for (int i = lo; i < hi; i++) { // stage 1: every bucket's version and home slot, independent loads
                long h = hs[i], b = h & (NBUCKETS - 1);
                s += m.map.getLong(m.metaWord(b, M_VERSION));
                s += m.map.getLong(FIXED_BYTES + (b * slots + ((h >>> BUCKET_BITS) & mask)) * WORD);
            }
            long span = RECORD_HEADER + ks + (vals != null ? 64 : 0);
            for (int i = lo; i < hi; i++) { // stage 2: the record of the first slot with the key's tag
                long h = hs[i], b = h & (NBUCKETS - 1);
                long ibase = FIXED_BYTES + b * slots * WORD, tag = h >>> TAG_SHIFT;
                long sl = (h >>> BUCKET_BITS) & mask;
                for (long j = 0, k = Math.min(slots, PROBE_AHEAD); j < k; j++) {
                    long e = m.map.getLong(ibase + sl * WORD);
                    if (e == 0) {
                        break;
                    }
                    if ((e >> POS_BITS) == tag) {
                        long o = (e & POS_MASK) - 1;
                        if (o >= 0 && o <= lim) {
                            long r = m.ringOff + b * ring + (o & ~(RECORD_ALIGN - 1));
                            long end = m.ringOff + b * ring + ring - WORD;
                            for (long p = r & ~63L; p < r + span; p += 64) {
                                s += m.map.getLong(Math.min(p, end) & ~7L);
                            }
                        }
                        break;
                    }
                    sl = (sl + 1) & mask;
                }
            }
        } catch (InternalError e) {
            throw seg.cutShort(m, e);
        }
        sink += s;
        for (int i = lo; i < hi; i++) { // stage 3: each key under its seqlock, from lines in cache
            if (keys[i] == null) {
                misses++;
                if (vals != null) {
                    vals[i] = null;
                } else {
                    has[i] = false;
                }
                continue;
            }
            boolean f = find(m, hs[i], keys[i], 0, vals != null);
            if (vals != null) {
                vals[i] = f ? value : null;
            } else {
                has[i] = f;
            }
        }
    }

    private static final long PROBE_AHEAD = 16; // slots a record's touch follows from the key's home slot
    private static final int STAGE = 256; // keys staged together (BatchBench: 64-256 best, 1024 a little slower)

    /** DONE with vlen >= 0 for a hit (and value set when want), -1 for a miss; or STUCK. */
    private int readKey(Mapped m, long h, long b, byte[] key, int off, boolean want) {
        long ver = m.metaWord(b, M_VERSION);
        for (int spins = 0;;) {
            long v1 = m.map.getLongAcquire(ver);
            if ((v1 & 1) != 0 && !(b == staticB && v1 == staticV)) {
                if (++spins >= SPIN_LIMIT) {
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
                v = new byte[(int) vlen];
                m.map.copy(hit, v, 0, (int) vlen); // copied before the second load of the version
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
            if (++spins >= SPIN_LIMIT) {
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
     * A bucket that stayed mid-write (section 7, step 5): accept its odd version as it
     * stands (damage: no lock holder, one corruption; or a dead holder, nothing counted), or
     * yield and let the caller read again (a live writer is at work).
     */
    private void stuckBucket(Mapped m, long b) {
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
                return;
            }
            if (!Liveness.isAlive(owner) && m.map.getLongAcquire(lock) == owner) { // only its own odd version
                staticB = b;
                staticV = v;
                return;
            }
        }
        Thread.yield();
    }

    private boolean isGivenUp(long b) {
        for (int i = 0; i < nGivenUp; i++) {
            if (givenUp[i] == b) {
                return true;
            }
        }
        return false;
    }

    private void giveUp(long b) {
        if (isGivenUp(b)) {
            return;
        }
        if (nGivenUp == givenUp.length) {
            givenUp = java.util.Arrays.copyOf(givenUp, nGivenUp * 2);
        }
        givenUp[nGivenUp++] = b;
    }
}
