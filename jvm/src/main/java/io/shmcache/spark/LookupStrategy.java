package io.shmcache.spark;

import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.SparkStrategy;
import scala.collection.immutable.Seq;

/** Plans a {@link LookupNode} as a {@link LookupExec} over its child's plan. */
public final class LookupStrategy extends SparkStrategy {
    @Override
    public Seq<SparkPlan> apply(LogicalPlan plan) {
        if (plan instanceof LookupNode n) {
            return Plans.seq(new LookupExec(planLater(n.child), n.spec()));
        }
        return Plans.seq();
    }
}
