package io.shmcache.spark;

import java.util.ArrayList;
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
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.NullType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StringType$;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Option;
import scala.Tuple3;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * The Spark SQL functions {@code shmcache_get(cache, key[, owner])} (binary, null where not
 * found) and {@code shmcache_contains(cache, key[, owner])} (boolean), as native Catalyst
 * expressions, and {@code shmcache_txmeta(value)} (the txmeta fields of a value, see
 * {@link TxMeta}): each
 * call is a {@link StaticInvoke} of {@link Lookups}, which Spark compiles into the stage's
 * generated code (no conversion of rows, no Python worker). The key is binary (raw) or a
 * string of hex digits; the key column's name goes along so an error can name it. With
 * {@code owner} (a user name or a uid, as a string or an integer), a cache whose file
 * another user owns fails the task naming both users (at attach and every re-attach).
 *
 * <p>Two ways to have them: {@code spark.sql.extensions=io.shmcache.spark.Functions} when
 * the session starts (SQL, Scala and Java users), or {@link #register} on a running
 * session (what shmcache.spark's lookup does from PySpark).
 */
public final class Functions extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
    static final String GET = "shmcache_get", CONTAINS = "shmcache_contains", TXMETA = "shmcache_txmeta";
    static final List<String> ALL = List.of(GET, CONTAINS, TXMETA);

    @Override
    public BoxedUnit apply(SparkSessionExtensions ext) {
        for (String f : ALL) {
            ext.injectFunction(new Tuple3<>(FunctionIdentifier.apply(f), info(f), new Builder(f)));
        }
        return BoxedUnit.UNIT;
    }

    /** Registers the functions in a running session (idempotent). */
    public static void register(org.apache.spark.sql.SparkSession spark) {
        FunctionRegistry reg = ((org.apache.spark.sql.classic.SparkSession) spark).sessionState().functionRegistry();
        for (String f : ALL) {
            reg.createOrReplaceTempFunction(f, new Builder(f), "java_udf");
        }
    }

    private static ExpressionInfo info(String f) {
        String usage = switch (f) {
            case GET -> "_FUNC_(cache, key[, owner]) - the value of key (binary, or a string of hex digits) in this "
                    + "machine's shmcache cache, null where not found; with owner (a user name or uid), a cache "
                    + "whose file another user owns is an error naming both";
            case CONTAINS -> "_FUNC_(cache, key[, owner]) - whether key (binary, or hex digits) is in this machine's "
                    + "shmcache cache; owner as for shmcache_get";
            default -> "_FUNC_(value) - the txmeta fields of a value (Teranode's MetaBytes) as a struct<fee, size, "
                    + "flags, parents, parent_vouts, block_height>, null where value is null or does not parse "
                    + "(block_height null where the value carries none)";
        };
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
            if (fn.equals(TXMETA)) {
                if (a.size() != 1) {
                    throw new IllegalArgumentException(fn + "(value) takes 1 argument, not " + a.size());
                }
                return TxMeta.expression(a.get(0));
            }
            if (a.size() != 2 && a.size() != 3) {
                throw new IllegalArgumentException(fn + "(cache, key[, owner]) takes 2 or 3 arguments, not " + a.size());
            }
            Expression cache = a.get(0), key = a.get(1);
            String column = key instanceof NamedExpression ? ((NamedExpression) key).name() : key.sql();
            return invoke(fn, cache, key, column, a.size() == 3 ? a.get(2) : null);
        }
    }

    /**
     * StaticInvoke of Lookups.get/contains(Hex) with the key column's name as a literal, and
     * the owner (null: none) as a string (an integer uid is cast by the analyzer).
     */
    static Expression invoke(String fn, Expression cache, Expression key, String column, Expression owner) {
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
        List<Expression> args = new ArrayList<>(List.of(cache, key, new Literal(UTF8String.fromString(column),
                DataTypes.StringType)));
        List<AbstractDataType> types = new ArrayList<>();
        if (owner != null) {
            DataType ot = owner.dataType();
            if (!(ot instanceof StringType || ot instanceof IntegerType || ot instanceof LongType
                    || ot instanceof ShortType || ot instanceof NullType)) {
                throw new IllegalArgumentException(fn + ": the owner is " + ot.simpleString() + "; expected a user "
                        + "name or a uid (a string or an integer)");
            }
            args.add(owner);
            // the analyzer casts an integer uid (or a null) to the string Lookups takes
            types.addAll(List.of(StringType$.MODULE$, kt, StringType$.MODULE$, StringType$.MODULE$));
        }
        // propagateNull=false: a null key is a miss (counted), not a null skipped;
        // not deterministic: the cache changes under the plan, so Spark must not reorder or repeat it
        return new StaticInvoke(Lookups.class, get ? DataTypes.BinaryType : DataTypes.BooleanType, method,
                CollectionConverters.asScala(args).toList(), CollectionConverters.asScala(types).toList(),
                false, get, false, Option.empty());
    }
}
