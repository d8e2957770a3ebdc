package io.shmcache.spark;

import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.catalyst.expressions.And;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.plans.logical.Filter;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;
import scala.Function1;
import scala.runtime.AbstractPartialFunction;

/**
 * An optimizer rule: the conjuncts of a filter over a {@link LookupNode} that read only the
 * lookup's input columns (and are deterministic) go below it, so that rows a query drops
 * are never looked up and the filter can reach the input's scan; the conjuncts that read the
 * looked-up column stay above. Spark's own pushdown passes only through the nodes it knows.
 */
public final class PushFiltersBelowLookup extends Rule<LogicalPlan> {
    @Override
    public LogicalPlan apply(LogicalPlan plan) {
        return plan.transformUp(new AbstractPartialFunction<LogicalPlan, LogicalPlan>() {
            @Override
            public boolean isDefinedAt(LogicalPlan p) {
                return p instanceof Filter f && f.child() instanceof LookupNode n && !below(f, n).isEmpty();
            }

            @Override
            public <A1 extends LogicalPlan, B1> B1 applyOrElse(A1 p, Function1<A1, B1> otherwise) {
                if (!isDefinedAt(p)) {
                    return otherwise.apply(p);
                }
                Filter f = (Filter) p;
                LookupNode n = (LookupNode) f.child();
                List<Expression> down = below(f, n), up = new ArrayList<>(conjuncts(f.condition()));
                up.removeAll(down);
                LogicalPlan moved = n.withNewChildrenInternal(Plans.indexed(new Filter(and(down), n.child)));
                @SuppressWarnings("unchecked")
                B1 out = (B1) (up.isEmpty() ? moved : new Filter(and(up), moved));
                return out;
            }
        });
    }

    /** The conjuncts of f that may go below n. */
    private static List<Expression> below(Filter f, LookupNode n) {
        List<Expression> down = new ArrayList<>();
        for (Expression e : conjuncts(f.condition())) {
            if (e.deterministic() && e.references().subsetOf(n.child.outputSet())) {
                down.add(e);
            }
        }
        return down;
    }

    private static List<Expression> conjuncts(Expression e) {
        List<Expression> out = new ArrayList<>();
        if (e instanceof And a) {
            out.addAll(conjuncts(a.left()));
            out.addAll(conjuncts(a.right()));
        } else {
            out.add(e);
        }
        return out;
    }

    private static Expression and(List<Expression> es) {
        Expression out = es.get(0);
        for (int i = 1; i < es.size(); i++) {
            out = new And(out, es.get(i));
        }
        return out;
    }
}
