package io.shmcache.spark;

import io.shmcache.TxMetaValue;
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
 * null for null. The parse and its checks are {@link TxMetaValue}'s (shared with
 * {@code shmcache-jvm get --decode txmeta}); a value that fails them, like a null value, is
 * a null struct (every column null); block_height is null where the value carries none.
 * fee and size are the u64 as a signed long (as numpy's astype(int64)), flags 0..255 as an
 * int. Never throws on bad bytes.
 */
public final class TxMeta {
    private TxMeta() {}

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

    /** The fields of one value, or null if it is null or does not parse (see the class comment). */
    public static InternalRow decode(byte[] v) {
        TxMetaValue m = TxMetaValue.parse(v);
        if (m == null) {
            return null;
        }
        int n = m.parents();
        Object[] parents = new Object[n], vouts = new Object[n];
        for (int j = 0; j < n; j++) {
            parents[j] = m.parent(j);
            vouts[j] = UnsafeArrayData.fromPrimitiveArray(m.vouts(j));
        }
        Object height = m.blockHeight() < 0 ? null : (Object) m.blockHeight();
        return new GenericInternalRow(new Object[] {m.fee(), m.size(), m.flags(), new GenericArrayData(parents),
            new GenericArrayData(vouts), height});
    }
}
