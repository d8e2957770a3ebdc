package io.shmcache.spark;

import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.AttributeSet;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import scala.collection.immutable.IndexedSeq;
import scala.collection.immutable.Seq;

/**
 * The batched lookup in a query's logical plan: the child's rows with one column appended,
 * {@code out}, the value of {@code key}'s key in {@code cache} (binary) or, values false,
 * whether it is present (boolean). A node of the plan rather than an RDD under a new
 * DataFrame, so that Spark plans through it (columns the query does not use are pruned
 * below it, one SQL execution runs the whole query, a streaming query plans it in each
 * micro-batch); {@link LookupStrategy} plans it as a {@link LookupExec}.
 */
public final class LookupNode extends LogicalPlan {
    private static final long serialVersionUID = 1L;
    final LogicalPlan child;
    final Attribute key, out;
    final String cache, owner; // owner null: any user's cache
    final boolean values;

    public LookupNode(LogicalPlan child, Attribute key, String cache, String owner, Attribute out, boolean values) {
        this.child = child;
        this.key = key;
        this.cache = cache;
        this.owner = owner;
        this.out = out;
        this.values = values;
    }

    @Override
    public Seq<LogicalPlan> children() {
        return Plans.seq(child);
    }

    @Override
    public Seq<Attribute> output() {
        return Plans.append(child.output(), out);
    }

    @Override
    public AttributeSet producedAttributes() {
        return Plans.set(out);
    }

    @Override
    public LogicalPlan withNewChildrenInternal(IndexedSeq<LogicalPlan> children) {
        return new LookupNode(children.head(), key, cache, owner, out, values);
    }

    @Override
    public String nodeName() {
        return "ShmcacheLookup";
    }

    @Override
    public String simpleString(int maxFields) {
        return spec().describe(nodeName());
    }

    LookupSpec spec() {
        return new LookupSpec(key, cache, owner, out, values);
    }

    @Override
    public int productArity() {
        return 6;
    }

    @Override
    public Object productElement(int n) {
        return switch (n) {
            case 0 -> child;
            case 1 -> key;
            case 2 -> cache;
            case 3 -> owner;
            case 4 -> out;
            case 5 -> values;
            default -> throw new IndexOutOfBoundsException(n);
        };
    }

    @Override
    public boolean canEqual(Object that) {
        return that instanceof LookupNode;
    }
}
