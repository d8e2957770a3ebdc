package io.shmcache.spark;

import io.shmcache.Call;
import io.shmcache.Segment;
import io.shmcache.ShmcacheException;
import io.shmcache.Values;
import java.io.Serializable;
import java.util.HexFormat;
import org.apache.spark.Dependency;
import org.apache.spark.OneToOneDependency;
import org.apache.spark.Partition;
import org.apache.spark.TaskContext;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.catalyst.expressions.codegen.GenerateUnsafeRowJoiner;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowJoiner;
import org.apache.spark.sql.catalyst.expressions.codegen.UnsafeRowWriter;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
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
 * looked up {@link #CHUNK} rows at a time with {@link Call#getBatch} so that the cache
 * misses of a chunk's keys overlap (a Catalyst expression sees one row at a time: each
 * key's index slot and then its record, two dependent misses, none overlapped). The plan
 * is the DataFrame's rows ({@code queryExecution().toRdd()}) mapped partition by
 * partition in the executors' JVM, no Python worker; the result is a new DataFrame over
 * that RDD (so Spark plans the input and what follows the lookup apart). Not for
 * streaming DataFrames (they have no RDD): lookup() keeps the expression there.
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
        boolean hex = kt instanceof StringType;
        if (!hex && !(kt instanceof BinaryType)) {
            throw new IllegalArgumentException(Lookups.WHO + ": key column '" + keyCol + "' is " + kt.simpleString()
                    + "; expected binary or string (hex)");
        }
        RDD<InternalRow> looked = new Looked(ds, new Part(cache, owner, keyCol, schema, k, hex, values));
        looked.setName("shmcache lookup of '" + keyCol + "' in cache '" + cache + "'");
        StructType outSchema = schema.add(out, values ? DataTypes.BinaryType : DataTypes.BooleanType, true);
        return ds.sparkSession().internalCreateDataFrame(looked, outSchema, false);
    }

    /**
     * The DataFrame's rows with the lookup's column. Its input ({@code queryExecution().toRdd()})
     * is made when Spark first asks for the partitions, in the action that runs the job: made
     * at once, it would run an adaptive plan's shuffle stages when lookup() is called, before
     * any action.
     */
    private static final class Looked extends RDD<InternalRow> {
        private static final long serialVersionUID = 1L;
        private static final scala.reflect.ClassTag<InternalRow> TAG = scala.reflect.ClassTag$.MODULE$.apply(InternalRow.class);
        private final transient org.apache.spark.sql.classic.Dataset<Row> ds; // the driver's only
        private final Part part;
        private volatile RDD<InternalRow> input; // made on the driver before any task is sent

        @SuppressWarnings("unchecked")
        Looked(org.apache.spark.sql.classic.Dataset<Row> ds, Part part) {
            super(ds.sparkSession().sparkContext(),
                    (scala.collection.immutable.Seq<Dependency<?>>) (Object) scala.collection.immutable.Nil$.MODULE$, TAG);
            this.ds = ds;
            this.part = part;
        }

        private RDD<InternalRow> input() {
            RDD<InternalRow> in = input;
            if (in == null) {
                synchronized (this) {
                    if (input == null) {
                        input = ds.queryExecution().toRdd();
                    }
                    in = input;
                }
            }
            return in;
        }

        @Override
        public Partition[] getPartitions() {
            return input().partitions();
        }

        @Override
        public scala.collection.immutable.Seq<Dependency<?>> getDependencies() {
            Dependency<?> d = new OneToOneDependency<>(input());
            return scala.jdk.javaapi.CollectionConverters.asScala(java.util.List.<Dependency<?>>of(d)).toList();
        }

        @Override
        public scala.collection.immutable.Seq<String> getPreferredLocations(Partition split) {
            return input().preferredLocations(split);
        }

        @Override
        public Iterator<InternalRow> compute(Partition split, TaskContext ctx) {
            return part.apply(input.iterator(split, ctx));
        }
    }

    /** One partition's lookup (serialized to the executors). */
    private static final class Part extends AbstractFunction1<Iterator<InternalRow>, Iterator<InternalRow>>
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
