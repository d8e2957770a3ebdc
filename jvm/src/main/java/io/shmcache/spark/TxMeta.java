package io.shmcache.spark;

import java.util.Arrays;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeArrayData;
import org.apache.spark.sql.catalyst.expressions.objects.StaticInvoke;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.AbstractDataType;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.NullType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Teranode's txmeta value (MetaBytes), decoded in the executor's JVM: the Spark SQL
 * function {@code shmcache_txmeta(value)}, a struct of the columns the Python decoder
 * gives (shmcache/formats/txmeta.py: decode() and arrow_fields()), field for field and
 * null for null:
 *
 * <pre>
 * fee u64 LE | size u64 LE | flags u8 | parentCount u32 LE     8 + 8 + 1 + 4 = 21 B
 * parentCount x 32 B parent tx hashes
 * per parent: voutCount u32 LE, voutCount x u32 LE vout
 * [block height u32 BE]                                        present iff 4 bytes remain
 * </pre>
 *
 * The checks are the Python decoder's, in its order: the fixed part fits; the parent
 * count fits in what is left (each parent needs its hash and a vout count, so a hostile
 * count sizes nothing); every vout list fits; what remains after the last list is 0 or 4
 * bytes. A value that fails, like a null value, is a null struct (every column null);
 * block_height is null where the value carries none. fee and size are the u64 as a signed
 * long (as numpy's astype(int64)), flags 0..255 as an int. Never throws on bad bytes.
 */
public final class TxMeta {
    private TxMeta() {}

    static final int HASH = 32, FIXED = 8 + 8 + 1 + 4, HEIGHT = 4;

    /**
     * The struct's type: the fields of txmeta.arrow_fields() as Spark types (made at plan
     * time, not when the class loads: the decoder alone needs none of the types' classes).
     */
    public static StructType type() {
        return new StructType(new StructField[] {
            field("fee", DataTypes.LongType),
            field("size", DataTypes.LongType),
            field("flags", DataTypes.IntegerType),
            field("parents", new ArrayType(DataTypes.BinaryType, true)),
            field("parent_vouts", new ArrayType(new ArrayType(DataTypes.LongType, true), true)),
            field("block_height", DataTypes.LongType),
        });
    }

    private static StructField field(String name, org.apache.spark.sql.types.DataType t) {
        return new StructField(name, t, true, Metadata.empty());
    }

    /** {@code shmcache_txmeta(value)}: a StaticInvoke of {@link #decode}, compiled into the stage's code. */
    static Expression expression(Expression value) {
        if (!(value.dataType() instanceof BinaryType || value.dataType() instanceof NullType)) {
            throw new IllegalArgumentException(Functions.TXMETA + ": the value is " + value.dataType().simpleString()
                    + "; expected binary");
        }
        List<AbstractDataType> types = List.of(DataTypes.BinaryType);
        // propagateNull: a null value is a null struct without a call; deterministic: a pure function
        return new StaticInvoke(TxMeta.class, type(), "decode", CollectionConverters.asScala(List.of(value)).toList(),
                CollectionConverters.asScala(types).toList(), true, true, true, Option.empty());
    }

    private static long u32(byte[] d, int p) {
        return (d[p] & 0xFFL) | (d[p + 1] & 0xFFL) << 8 | (d[p + 2] & 0xFFL) << 16 | (d[p + 3] & 0xFFL) << 24;
    }

    private static long u64(byte[] d, int p) {
        return u32(d, p) | u32(d, p + 4) << 32;
    }

    /** The fields of one value, or null if it is null or does not parse (see the class comment). */
    public static InternalRow decode(byte[] v) {
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
        Object[] parents = new Object[n], vouts = new Object[n];
        for (int j = 0; j < n; j++) {
            parents[j] = Arrays.copyOfRange(v, hashes + j * HASH, hashes + (j + 1) * HASH);
            long[] vs = new long[vcount[j]];
            for (int k = 0; k < vs.length; k++) {
                vs[k] = u32(v, vstart[j] + 4 * k);
            }
            vouts[j] = UnsafeArrayData.fromPrimitiveArray(vs);
        }
        Object height = null;
        if (end - p == HEIGHT) {
            height = (v[p] & 0xFFL) << 24 | (v[p + 1] & 0xFFL) << 16 | (v[p + 2] & 0xFFL) << 8 | (v[p + 3] & 0xFFL);
        }
        return new GenericInternalRow(new Object[] {u64(v, 0), u64(v, 8), v[16] & 0xFF,
            new GenericArrayData(parents), new GenericArrayData(vouts), height});
    }
}
