package io.shmcache;

/**
 * A batch's values in one buffer ({@link Call#getPacked}): value i is
 * {@code data()[start(i) .. start(i) + length(i))}, and {@code length(i)} is -1 where the
 * key was not found or was null. Reused from batch to batch (its buffer grows, never
 * shrinks), so a batch of lookups allocates nothing per key; what a batch returned is valid
 * until the next one fills it.
 */
public final class Values {
    private static final int MAX_ARRAY = Integer.MAX_VALUE - 8;

    private byte[] data = new byte[1 << 14];
    private int[] start = new int[0];
    private int[] length = new int[0];
    private int used;

    /** The buffer the values are in. */
    public byte[] data() {
        return data;
    }

    /** Where value i starts in {@link #data()}. */
    public int start(int i) {
        return start[i];
    }

    /** Value i's length in bytes, -1 where its key was not found or was null. */
    public int length(int i) {
        return length[i];
    }

    /** Whether key i was found. */
    public boolean found(int i) {
        return length[i] >= 0;
    }

    /** Value i as an array of its own (a copy), null where not found. */
    public byte[] copy(int i) {
        return length[i] < 0 ? null : java.util.Arrays.copyOfRange(data, start[i], start[i] + length[i]);
    }

    /** Empties the buffer for a batch of n keys. */
    void reset(int n) {
        if (start.length < n) {
            start = new int[n];
            length = new int[n];
        }
        used = 0;
    }

    /**
     * Where the next value, of len bytes, is copied: the buffer grown to hold it. A batch
     * whose values do not fit one Java array is refused, naming the sizes.
     */
    int reserve(String cache, long len) {
        if (used + len > MAX_ARRAY) {
            throw new ShmcacheException.Corrupt(cache, null, "a batch's values come to more than " + MAX_ARRAY
                    + " bytes (" + used + " so far and one of " + len + "), more than one Java array holds: look "
                    + "fewer keys up at a time", null);
        }
        int need = used + (int) len;
        if (need > data.length) {
            data = java.util.Arrays.copyOf(data, (int) Math.min(MAX_ARRAY, Math.max(need, 2L * data.length)));
        }
        return used;
    }

    /** Value i is the len bytes copied at {@link #reserve}'s position. */
    void found(int i, int len) {
        start[i] = used;
        length[i] = len;
        used += len;
    }

    /** Key i was not found (or was null). */
    void missing(int i) {
        start[i] = used;
        length[i] = -1;
    }
}
