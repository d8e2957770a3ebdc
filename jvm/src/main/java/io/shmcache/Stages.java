package io.shmcache;

import static io.shmcache.Layout.*;

/**
 * The first two stages of a batched lookup ({@link Call#getBatch}, {@link Call#getPacked}):
 * the lines a stage of keys will be read from, brought into cache together so that their
 * misses overlap (a key at a time, its index slot and then its record are two dependent
 * misses, none overlapped). Stage 1 loads every key's bucket version and home index slot;
 * stage 2, through those slots now in cache, the lines of the record of the first slot with
 * each key's tag. Each stage first computes its addresses, every one checked against the
 * mapping, then loads them in a loop of nothing but loads (Mapping.touch): Java has no
 * prefetch instruction, and a load that misses holds its place in the CPU's window until its
 * line arrives, so the fewer instructions between two loads, the more misses in flight.
 *
 * <p>These loads are hints, outside the seqlock: their values are never used, so a write
 * racing them changes nothing a lookup returns; the bounds are those of every read (the
 * geometry read at attach), so no byte pattern makes them leave the mapping.
 */
final class Stages {
    static final int STAGE = 256; // keys staged together (BatchBench: 64-256 best, 512 and more a little slower)
    private static final long PROBE_AHEAD = 16; // slots a record's touch follows from the key's home slot
    private static final long MIN_GUESS = 64, MAX_GUESS = 1024;

    private long[] addrs = new long[0];
    private long valueGuess = MIN_GUESS; // value bytes stage 2 touches past a record's key
    private long sink; // the loads' values land here, so that the compiler keeps them

    /** Brings the lines of keys lo..hi (hashes hs) into cache; values: their values' lines too. */
    void touch(Mapped m, long[] hs, int lo, int hi, boolean values) {
        int ks = m.keySize;
        long slots = m.slots, ring = m.ring, mask = slots - 1, s = 0;
        long lim = ring - RECORD_HEADER - ks; // a record header and key fit from an offset <= lim
        long span = RECORD_HEADER + ks + (values ? valueGuess : 0);
        int most = (hi - lo) * (int) (2 + (span + 63) / 64);
        if (addrs.length < most) {
            addrs = new long[most];
        }
        long[] at = addrs;
        int na = 0;
        for (int i = lo; i < hi; i++) { // stage 1: every bucket's version and home slot
            long h = hs[i], b = h & (NBUCKETS - 1);
            at[na++] = m.map.wordAt(m.metaWord(b, M_VERSION));
            at[na++] = m.map.wordAt(FIXED_BYTES + (b * slots + ((h >>> BUCKET_BITS) & mask)) * WORD);
        }
        s += m.map.touch(at, na);
        na = 0;
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
                        for (long p = r & ~63L; p < r + span; p += 64) { // every line the span is in
                            at[na++] = m.map.wordAt(Math.min(p, end) & ~7L);
                        }
                    }
                    break;
                }
                sl = (sl + 1) & mask;
            }
        }
        s += m.map.touch(at, na);
        sink += s;
    }

    /**
     * The longest value a stage read: the next stages touch that many value bytes of each
     * record (the lines of a value read whole from the cache; a guess that falls short
     * leaves the last line a miss in stage 3, which is not overlapped).
     */
    void longest(long len) {
        valueGuess = Math.min(MAX_GUESS, Math.max(MIN_GUESS, len));
    }
}
