package io.shmcache.spark;

import io.shmcache.Call;
import io.shmcache.Segment;
import io.shmcache.ShmcacheException;
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
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.JoinedRow;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructType;
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
        RDD<InternalRow> looked = new Looked(ds, new Part(cache, owner, keyCol, k, hex, values));
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
        final int k;
        final boolean hex, values;

        Part(String cache, String owner, String column, int k, boolean hex, boolean values) {
            this.cache = cache;
            this.owner = owner;
            this.column = column;
            this.k = k;
            this.hex = hex;
            this.values = values;
        }

        @Override
        public Iterator<InternalRow> apply(Iterator<InternalRow> in) {
            return new Chunks(this, in);
        }
    }

    /** The rows of a partition with the lookup's column, a chunk looked up at a time. */
    private static final class Chunks extends AbstractIterator<InternalRow> {
        private final Part p;
        private final Iterator<InternalRow> in;
        private final InternalRow[] rows = new InternalRow[CHUNK];
        private final byte[][] keys = new byte[CHUNK][], vals;
        private final boolean[] has;
        private final GenericInternalRow extra = new GenericInternalRow(1);
        private final JoinedRow joined = new JoinedRow();
        private Segment seg;
        private Call call;
        private int n, at;
        private long base; // the partition's rows before this chunk

        Chunks(Part p, Iterator<InternalRow> in) {
            this.p = p;
            this.in = in;
            this.vals = p.values ? new byte[CHUNK][] : null;
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
            if (p.values) {
                extra.update(0, vals[i]);
                vals[i] = null;
            } else {
                extra.setBoolean(0, has[i]);
            }
            InternalRow r = rows[i];
            rows[i] = null;
            return joined.apply(r, extra);
        }

        private void fill() {
            base += n;
            n = at = 0;
            if (call == null) {
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
            }
            int ks = -1;
            while (n < CHUNK && in.hasNext()) {
                InternalRow r = in.next().copy(); // the input's rows may be one object reused
                rows[n] = r;
                if (r.isNullAt(p.k)) {
                    keys[n] = null;
                } else if (p.hex) {
                    if (ks < 0) {
                        ks = keySize();
                    }
                    keys[n] = unhex(r.getUTF8String(p.k), ks, base + n);
                } else {
                    keys[n] = r.getBinary(p.k);
                }
                n++;
            }
            try {
                if (p.values) {
                    call.getBatch(keys, n, vals);
                } else {
                    call.containsBatch(keys, n, has);
                }
                if (call.pending() >= Lookups.FLUSH_EVERY || !in.hasNext()) {
                    call.flush(); // as the expression counts: a batch every FLUSH_EVERY keys and at the end
                }
            } catch (ShmcacheException.NotFound e) {
                throw gone(e);
            } catch (ShmcacheException.KeySize e) {
                int bad = call.badKey();
                if (bad < 0) {
                    throw e;
                }
                byte[] key = keys[bad];
                String kx = HexFormat.of().formatHex(key, 0, Math.min(key.length, 40)) + (key.length > 40 ? "..." : "");
                throw Lookups.keyError(p.cache, p.column, base + bad, "key " + kx + " is " + key.length
                        + " bytes; keys of this cache are " + keySize() + " bytes");
            }
            java.util.Arrays.fill(keys, 0, n, null);
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
