package io.shmcache.spark;

import io.shmcache.Call;
import io.shmcache.Segment;
import io.shmcache.ShmcacheException;
import io.shmcache.Values;
import java.io.Serializable;
import java.util.HexFormat;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.AttributeReference;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.expressions.codegen.GenerateUnsafeRowJoiner;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowJoiner;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;
import scala.collection.AbstractIterator;
import scala.collection.Iterator;
import scala.runtime.AbstractFunction1;

/**
 * The batched lookup: a DataFrame with one column appended, the value of each row's key
 * (binary, null where not found or the key is null) or whether it is present (boolean),
 * looked up {@link #CHUNK} rows at a time with {@link Call#getPacked} so that the cache
 * misses of a chunk's keys overlap (a Catalyst expression sees one row at a time: each
 * key's index slot and then its record, two dependent misses, none overlapped). The
 * lookup is a node of the query's plan ({@link LookupNode}, planned by
 * {@link LookupStrategy} as a {@link LookupExec} that maps its input partition by
 * partition in the executors' JVM, no Python worker), so Spark plans through it: columns
 * the query does not use are pruned below it, filters on the input's columns are pushed
 * below it ({@link PushFiltersBelowLookup}), and a streaming query plans it in each
 * micro-batch.
 *
 * <p>The same behaviour as the expression ({@link Lookups}): one handle per (cache, owner)
 * per JVM, looked at at each partition's start (a re-created cache is mapped again); a
 * cache missing on this host, a key of the wrong size or not hex fail the task with the
 * same messages (the row is the partition's); hits and misses count in the readers'
 * companion, a batch every {@link Lookups#FLUSH_EVERY} keys and at the partition's end (a
 * bucket stuck mid-write is given up for that long, as by the expression).
 */
public final class BatchLookups {
    private BatchLookups() {}

    /** Rows a chunk looks up together. */
    static final int CHUNK = 256;

    /**
     * {@code df} with column {@code out} appended: the value of {@code keyCol}'s key in cache
     * (binary) when values, else whether it is present (boolean); owner null for any user.
     */
    public static Dataset<Row> lookup(Dataset<Row> df, String keyCol, String cache, String owner, String out,
                                      boolean values) {
        org.apache.spark.sql.classic.Dataset<Row> ds = (org.apache.spark.sql.classic.Dataset<Row>) df;
        StructType schema = ds.schema();
        int k = schema.fieldIndex(keyCol);
        DataType kt = schema.fields()[k].dataType();
        if (!(kt instanceof StringType) && !(kt instanceof BinaryType)) {
            throw new IllegalArgumentException(Lookups.WHO + ": key column '" + keyCol + "' is " + kt.simpleString()
                    + "; expected binary or string (hex)");
        }
        org.apache.spark.sql.classic.SparkSession spark = ds.sparkSession();
        plannable(spark);
        LogicalPlan plan = ds.logicalPlan();
        Attribute key = scala.jdk.javaapi.CollectionConverters.asJava(ds.queryExecution().analyzed().output()).get(k);
        Attribute added = new AttributeReference(out, values ? DataTypes.BinaryType : DataTypes.BooleanType, true,
                Metadata.empty(), NamedExpression.newExprId(), Plans.<String>seq());
        return org.apache.spark.sql.classic.Dataset$.MODULE$.ofRows(spark,
                new LookupNode(plan, key, cache, owner, added, values));
    }

    /**
     * The session plans LookupNodes: its planner's extra strategies hold a LookupStrategy,
     * its optimizer's extra rules a PushFiltersBelowLookup (idempotent).
     */
    static synchronized void plannable(org.apache.spark.sql.classic.SparkSession spark) {
        org.apache.spark.sql.ExperimentalMethods x = spark.experimental();
        if (!Plans.holds(x.extraStrategies(), LookupStrategy.class)) {
            x.extraStrategies_$eq(Plans.with(x.extraStrategies(), new LookupStrategy()));
        }
        if (!Plans.holds(x.extraOptimizations(), PushFiltersBelowLookup.class)) {
            x.extraOptimizations_$eq(Plans.with(x.extraOptimizations(), new PushFiltersBelowLookup()));
        }
    }

    /** One partition's lookup (serialized to the executors). */
    static final class Part extends AbstractFunction1<Iterator<InternalRow>, Iterator<InternalRow>>
            implements Serializable {
        private static final long serialVersionUID = 1L;
        final String cache, owner, column;
        final StructType schema; // the input's
        final int k;
        final boolean hex, values;

        Part(String cache, String owner, String column, StructType schema, int k, boolean hex, boolean values) {
            this.cache = cache;
            this.owner = owner;
            this.column = column;
            this.schema = schema;
            this.k = k;
            this.hex = hex;
            this.values = values;
        }

        @Override
        public Iterator<InternalRow> apply(Iterator<InternalRow> in) {
            return new Chunks(this, in);
        }
    }

    /**
     * The rows of a partition with the lookup's column, a chunk looked up at a time, with
     * nothing allocated per row: each input row's bytes are copied into one buffer (the
     * input's rows may be one object reused), its key into one array of the chunk's keys
     * ({@link Call#getPacked}), the values land in one buffer ({@link Values}), and each
     * output row is the input row and a one-field row of its value joined as UnsafeRows
     * (Spark's UnsafeRowJoiner; the row returned is reused, as an RDD's rows may be).
     */
    private static final class Chunks extends AbstractIterator<InternalRow> {
        private final Part p;
        private final Iterator<InternalRow> in;
        private final UnsafeRow[] rows = new UnsafeRow[CHUNK];
        private final boolean[] isNull = new boolean[CHUNK];
        private final boolean[] has;
        private final Values vals;
        private final UnsafeRowWriter extra = new UnsafeRowWriter(1, 64);
        private UnsafeProjection toUnsafe; // for an input whose rows are not UnsafeRows
        private UnsafeRowJoiner joiner;
        private byte[] keys, arena = new byte[1 << 16];
        private Segment seg;
        private Call call;
        private int n, at, ks = -1;
        private long base; // the partition's rows before this chunk

        Chunks(Part p, Iterator<InternalRow> in) {
            this.p = p;
            this.in = in;
            this.vals = p.values ? new Values() : null;
            this.has = p.values ? null : new boolean[CHUNK];
        }

        @Override
        public boolean hasNext() {
            if (at < n) {
                return true;
            }
            if (!in.hasNext()) {
                return false;
            }
            fill();
            return n > 0;
        }

        @Override
        public InternalRow next() {
            if (!hasNext()) {
                throw new java.util.NoSuchElementException();
            }
            int i = at++;
            extra.reset();
            extra.zeroOutNullBytes();
            if (!p.values) {
                extra.write(0, has[i]);
            } else if (vals.found(i)) {
                extra.write(0, vals.data(), vals.start(i), vals.length(i));
            } else {
                extra.setNullAt(0);
            }
            return joiner.join(rows[i], extra.getRow());
        }

        private void fill() {
            base += n;
            n = at = 0;
            if (call == null) {
                start();
            }
            int used = 0;
            while (n < CHUNK && in.hasNext()) {
                InternalRow r0 = in.next();
                UnsafeRow r = r0 instanceof UnsafeRow u ? u : toUnsafe(r0);
                int size = r.getSizeInBytes();
                if (used + size > arena.length) { // rows already copied keep the old buffer
                    arena = new byte[Math.max(arena.length, size) * 2];
                    used = 0;
                }
                r.writeToMemory(arena, Platform.BYTE_ARRAY_OFFSET + used);
                rows[n].pointTo(arena, Platform.BYTE_ARRAY_OFFSET + used, size);
                used += size;
                isNull[n] = r.isNullAt(p.k);
                if (!isNull[n]) {
                    key(r, n);
                }
                n++;
            }
            try {
                if (p.values) {
                    call.getPacked(keys, isNull, n, vals);
                } else {
                    call.containsPacked(keys, isNull, n, has);
                }
                if (call.pending() >= Lookups.FLUSH_EVERY || !in.hasNext()) {
                    call.flush(); // as the expression counts: a batch every FLUSH_EVERY keys and at the end
                }
            } catch (ShmcacheException.NotFound e) {
                throw gone(e);
            }
        }

        /** The partition's first chunk: its handle (looked at now), its call, its rows' shapes. */
        private void start() {
            try {
                seg = Lookups.handle(p.cache, p.owner);
                seg.check(); // the partition's first look at the name
            } catch (ShmcacheException.NotFound e) {
                throw gone(e);
            }
            call = seg.call();
            org.apache.spark.TaskContext ctx = org.apache.spark.TaskContext.get();
            if (ctx != null) { // a partition left unfinished (a limit, a failure) still counts its keys
                Call c = call;
                ctx.addTaskCompletionListener((org.apache.spark.util.TaskCompletionListener) done -> c.flush());
            }
            ks = keySize();
            keys = new byte[CHUNK * ks];
            for (int i = 0; i < CHUNK; i++) {
                rows[i] = new UnsafeRow(p.schema.length());
            }
            StructType added = new StructType().add("v", p.values ? DataTypes.BinaryType : DataTypes.BooleanType, true);
            joiner = GenerateUnsafeRowJoiner.create(p.schema, added);
        }

        private UnsafeRow toUnsafe(InternalRow r) {
            if (toUnsafe == null) {
                toUnsafe = UnsafeProjection.create(p.schema);
            }
            return toUnsafe.apply(r);
        }

        /** Row i's key into the chunk's keys at i * key_size: its bytes, or its hex decoded. */
        private void key(UnsafeRow r, int i) {
            if (p.hex) {
                byte[] k = unhex(r.getUTF8String(p.k), ks, base + i);
                System.arraycopy(k, 0, keys, i * ks, ks);
                return;
            }
            long where = r.getLong(p.k); // a binary field: its offset in the row and its size
            int off = (int) (where >> 32), size = (int) where;
            if (size != ks) {
                byte[] key = r.getBinary(p.k);
                String kx = HexFormat.of().formatHex(key, 0, Math.min(key.length, 40)) + (key.length > 40 ? "..." : "");
                throw Lookups.keyError(p.cache, p.column, base + i, "key " + kx + " is " + key.length
                        + " bytes; keys of this cache are " + ks + " bytes");
            }
            Platform.copyMemory(r.getBaseObject(), r.getBaseOffset() + off, keys, Platform.BYTE_ARRAY_OFFSET + (long) i * ks, ks);
        }

        private int keySize() {
            try {
                return seg.keySize();
            } catch (ShmcacheException.NotFound e) {
                throw gone(e);
            }
        }

        private RuntimeException gone(ShmcacheException.NotFound e) {
            Lookups.forget(p.cache, p.owner);
            return Lookups.missing(p.cache, e);
        }

        private byte[] unhex(UTF8String key, int ks, long row) {
            String s = key.toString();
            if (s.length() != 2 * ks) {
                throw Lookups.keyError(p.cache, p.column, row, "key " + Lookups.show(s) + " is " + s.length()
                        + " hex characters; keys of this cache are " + 2 * ks + " hex characters");
            }
            try {
                return HexFormat.of().parseHex(s);
            } catch (IllegalArgumentException e) {
                throw Lookups.keyError(p.cache, p.column, row, "key " + Lookups.show(s) + " is not " + 2 * ks
                        + " hex characters");
            }
        }
    }
}
