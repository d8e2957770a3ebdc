package io.shmcache.spark;

import java.util.List;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.analysis.FunctionRegistry;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.ExpressionInfo;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.expressions.objects.StaticInvoke;
import org.apache.spark.sql.types.AbstractDataType;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Option;
import scala.Tuple3;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * The Spark SQL functions {@code shmcache_get(cache, key)} (binary, null where not found)
 * and {@code shmcache_contains(cache, key)} (boolean), as native Catalyst expressions: each
 * call is a {@link StaticInvoke} of {@link Lookups}, which Spark compiles into the stage's
 * generated code (no conversion of rows, no Python worker). The key is binary (raw) or a
 * string of hex digits; the key column's name goes along so an error can name it.
 *
 * <p>Two ways to have them: {@code spark.sql.extensions=io.shmcache.spark.Functions} when
 * the session starts (SQL, Scala and Java users), or {@link #register} on a running
 * session (what shmcache.spark's lookup does from PySpark).
 */
public final class Functions extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
    static final String GET = "shmcache_get", CONTAINS = "shmcache_contains";

    @Override
    public BoxedUnit apply(SparkSessionExtensions ext) {
        ext.injectFunction(new Tuple3<>(FunctionIdentifier.apply(GET), info(GET), new Builder(GET)));
        ext.injectFunction(new Tuple3<>(FunctionIdentifier.apply(CONTAINS), info(CONTAINS), new Builder(CONTAINS)));
        return BoxedUnit.UNIT;
    }

    /** Registers both functions in a running session (idempotent). */
    public static void register(org.apache.spark.sql.SparkSession spark) {
        FunctionRegistry reg = ((org.apache.spark.sql.classic.SparkSession) spark).sessionState().functionRegistry();
        for (String f : List.of(GET, CONTAINS)) {
            reg.createOrReplaceTempFunction(f, new Builder(f), "java_udf");
        }
    }

    private static ExpressionInfo info(String f) {
        String usage = f.equals(GET)
                ? "_FUNC_(cache, key) - the value of key (binary, or a string of hex digits) in this machine's "
                        + "shmcache cache, null where not found"
                : "_FUNC_(cache, key) - whether key (binary, or hex digits) is in this machine's shmcache cache";
        return new ExpressionInfo(Functions.class.getName(), null, f, usage, "");
    }

    /** Builds the expression of one call from its arguments (cache, key). */
    static final class Builder extends AbstractFunction1<Seq<Expression>, Expression> implements java.io.Serializable {
        private static final long serialVersionUID = 1L;
        private final String fn;

        Builder(String fn) {
            this.fn = fn;
        }

        @Override
        public Expression apply(Seq<Expression> args) {
            List<Expression> a = CollectionConverters.asJava(args);
            if (a.size() != 2) {
                throw new IllegalArgumentException(fn + "(cache, key) takes 2 arguments, not " + a.size());
            }
            Expression cache = a.get(0), key = a.get(1);
            String column = key instanceof NamedExpression ? ((NamedExpression) key).name() : key.sql();
            return invoke(fn, cache, key, column);
        }
    }

    /** StaticInvoke of Lookups.get/contains(Hex) with the key column's name as a literal. */
    static Expression invoke(String fn, Expression cache, Expression key, String column) {
        DataType kt = key.dataType();
        boolean hex;
        if (kt instanceof BinaryType) {
            hex = false;
        } else if (kt instanceof StringType) {
            hex = true;
        } else {
            throw new IllegalArgumentException(fn + ": key column '" + column + "' is " + kt.simpleString()
                    + "; expected binary (raw keys) or string (hex)");
        }
        if (!(cache.dataType() instanceof StringType)) {
            throw new IllegalArgumentException(fn + ": the cache name is " + cache.dataType().simpleString()
                    + "; expected a string");
        }
        boolean get = fn.equals(GET);
        String method = (get ? "get" : "contains") + (hex ? "Hex" : "");
        Seq<Expression> args = CollectionConverters.asScala(List.of(cache, key, new Literal(
                UTF8String.fromString(column), DataTypes.StringType))).toList();
        Seq<AbstractDataType> none = CollectionConverters.<AbstractDataType>asScala(List.of()).toList();
        // propagateNull=false: a null key is a miss (counted), not a null skipped;
        // not deterministic: the cache changes under the plan, so Spark must not reorder or repeat it
        return new StaticInvoke(Lookups.class, get ? DataTypes.BinaryType : DataTypes.BooleanType, method, args, none,
                false, get, false, Option.empty());
    }
}
