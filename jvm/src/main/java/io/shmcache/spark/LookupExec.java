package io.shmcache.spark;

import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.types.StringType;
import scala.collection.immutable.IndexedSeq;
import scala.collection.immutable.Seq;

/**
 * A {@link LookupNode} executed: its input's partitions mapped by BatchLookups' chunks in
 * the executors' JVM. What it looks up is the logical node's ({@link LookupSpec}).
 */
public final class LookupExec extends SparkPlan {
    private static final long serialVersionUID = 1L;
    private static final scala.reflect.ClassTag<InternalRow> TAG = scala.reflect.ClassTag$.MODULE$.apply(InternalRow.class);
    final SparkPlan child;
    final LookupSpec spec;

    public LookupExec(SparkPlan child, LookupSpec spec) {
        this.child = child;
        this.spec = spec;
    }

    @Override
    public RDD<InternalRow> doExecute() {
        Seq<Attribute> in = child.output();
        Attribute key = spec.key();
        BatchLookups.Part part = new BatchLookups.Part(spec.cache(), spec.owner(), key.name(), Plans.schema(in),
                Plans.indexOf(in, key), key.dataType() instanceof StringType, spec.values());
        return child.execute().mapPartitionsInternal(part, true, TAG);
    }

    @Override
    public Seq<SparkPlan> children() {
        return Plans.seq(child);
    }

    @Override
    public Seq<Attribute> output() {
        return Plans.append(child.output(), spec.out());
    }

    @Override
    public SparkPlan withNewChildrenInternal(IndexedSeq<SparkPlan> children) {
        return new LookupExec(children.head(), spec);
    }

    @Override
    public String nodeName() {
        return "ShmcacheLookup";
    }

    @Override
    public String simpleString(int maxFields) {
        return spec.describe(nodeName());
    }

    @Override
    public int productArity() {
        return 2;
    }

    @Override
    public Object productElement(int n) {
        return n == 0 ? child : spec;
    }

    @Override
    public boolean canEqual(Object that) {
        return that instanceof LookupExec;
    }
}
