package io.shmcache;

import java.util.HexFormat;

/**
 * Teranode's txmeta value (MetaBytes) parsed: the one parse behind the Spark SQL function
 * {@code shmcache_txmeta} ({@code io.shmcache.spark.TxMeta}) and {@code shmcache-jvm get
 * --decode txmeta} (docs/reader-contract.md), so both take the same checks (Spark is not on
 * the runnable jar's class path, so this class needs none of it).
 *
 * <pre>
 * fee u64 LE | size u64 LE | flags u8 | parentCount u32 LE     8 + 8 + 1 + 4 = 21 B
 * parentCount x 32 B parent tx hashes
 * per parent: voutCount u32 LE, voutCount x u32 LE vout
 * [block height u32 BE]                                        present iff 4 bytes remain
 * </pre>
 *
 * The checks are the Python decoder's (formats/txmeta.py), in its order: the fixed part
 * fits; the parent count fits in what is left (each parent needs its hash and a vout count,
 * so a hostile count sizes nothing); every vout list fits; what remains after the last list
 * is 0 or 4 bytes. {@link #parse} returns null for a value that fails (or is null), never
 * throws on bad bytes, and keeps offsets into the value, copying nothing.
 */
public final class TxMetaValue {
    public static final int HASH = 32, FIXED = 8 + 8 + 1 + 4, HEIGHT = 4;

    private final byte[] v;
    private final int hashes;         // where the parent hashes start
    private final int[] vstart, vcount; // each parent's vouts: where they start, how many
    private final long height;        // -1: none

    private TxMetaValue(byte[] v, int hashes, int[] vstart, int[] vcount, long height) {
        this.v = v;
        this.hashes = hashes;
        this.vstart = vstart;
        this.vcount = vcount;
        this.height = height;
    }

    private static long u32(byte[] d, int p) {
        return (d[p] & 0xFFL) | (d[p + 1] & 0xFFL) << 8 | (d[p + 2] & 0xFFL) << 16 | (d[p + 3] & 0xFFL) << 24;
    }

    private static long u64(byte[] d, int p) {
        return u32(d, p) | u32(d, p + 4) << 32;
    }

    /** The value parsed, or null if it is null or does not parse (see the class comment). */
    public static TxMetaValue parse(byte[] v) {
        if (v == null) {
            return null;
        }
        final int end = v.length;
        if (end < FIXED) {
            return null;
        }
        long pc = u32(v, 17);
        int p = FIXED;
        if (pc > (end - p) / (HASH + 4)) {
            return null;
        }
        int n = (int) pc; // < 2**31 / 36: fits
        int hashes = p;
        p += n * HASH;
        int[] vstart = new int[n], vcount = new int[n];
        for (int j = 0; j < n; j++) {
            if (end - p < 4) {
                return null;
            }
            long vc = u32(v, p);
            p += 4;
            if (vc > (end - p) / 4) {
                return null;
            }
            vstart[j] = p;
            vcount[j] = (int) vc;
            p += (int) vc * 4;
        }
        if (end - p != 0 && end - p != HEIGHT) {
            return null;
        }
        long height = end - p == HEIGHT
                ? (v[p] & 0xFFL) << 24 | (v[p + 1] & 0xFFL) << 16 | (v[p + 2] & 0xFFL) << 8 | (v[p + 3] & 0xFFL) : -1;
        return new TxMetaValue(v, hashes, vstart, vcount, height);
    }

    /** The fee, a u64 (as a long's bits: {@link Long#toUnsignedString} reads it). */
    public long fee() {
        return u64(v, 0);
    }

    /** The size, a u64 (as {@link #fee()}). */
    public long size() {
        return u64(v, 8);
    }

    /** The flags byte, 0-255. */
    public int flags() {
        return v[16] & 0xFF;
    }

    public int parents() {
        return vcount.length;
    }

    /** Parent j's tx hash (a copy). */
    public byte[] parent(int j) {
        return java.util.Arrays.copyOfRange(v, hashes + j * HASH, hashes + (j + 1) * HASH);
    }

    /** Parent j's vouts, each a u32. */
    public long[] vouts(int j) {
        long[] vs = new long[vcount[j]];
        for (int k = 0; k < vs.length; k++) {
            vs[k] = u32(v, vstart[j] + 4 * k);
        }
        return vs;
    }

    /** The block height the value carries, -1 if none. */
    public long blockHeight() {
        return height;
    }

    /**
     * The object {@code get --decode txmeta} prints (docs/reader-contract.md), on one line:
     * {@code {"fee":..,"size":..,"flags":..,"parents":["<hex>",..],"parent_vouts":[[..],..],
     * "block_height":N or null}}, fee and size unsigned; {@code {"valid":false}} for null (a
     * value that does not parse).
     */
    public static String json(TxMetaValue m) {
        if (m == null) {
            return "{\"valid\":false}";
        }
        StringBuilder sb = new StringBuilder(128);
        sb.append("{\"fee\":").append(Long.toUnsignedString(m.fee()))
                .append(",\"size\":").append(Long.toUnsignedString(m.size()))
                .append(",\"flags\":").append(m.flags()).append(",\"parents\":[");
        HexFormat hex = HexFormat.of();
        for (int j = 0; j < m.parents(); j++) {
            sb.append(j == 0 ? "\"" : ",\"");
            hex.formatHex(sb, m.v, m.hashes + j * HASH, m.hashes + (j + 1) * HASH);
            sb.append('"');
        }
        sb.append("],\"parent_vouts\":[");
        for (int j = 0; j < m.parents(); j++) {
            sb.append(j == 0 ? "[" : ",[");
            for (int k = 0; k < m.vcount[j]; k++) {
                sb.append(k == 0 ? "" : ",").append(u32(m.v, m.vstart[j] + 4 * k));
            }
            sb.append(']');
        }
        sb.append("],\"block_height\":").append(m.height < 0 ? "null" : Long.toString(m.height)).append('}');
        return sb.toString();
    }
}
