package io.shmcache.spark;

import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.AttributeSet;
import org.apache.spark.sql.catalyst.types.DataTypeUtils;
import org.apache.spark.sql.types.StructType;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/** Scala collections of plan nodes and attributes, for the Java plan nodes of the lookup. */
final class Plans {
    private Plans() {}

    @SafeVarargs
    static <T> Seq<T> seq(T... xs) {
        return CollectionConverters.asScala(List.of(xs)).toList();
    }

    @SafeVarargs
    static <T> scala.collection.immutable.IndexedSeq<T> indexed(T... xs) {
        return CollectionConverters.asScala(List.of(xs)).toIndexedSeq();
    }

    /** Whether xs holds an instance of c. */
    static boolean holds(Seq<?> xs, Class<?> c) {
        for (Object x : CollectionConverters.asJava(xs)) {
            if (c.isInstance(x)) {
                return true;
            }
        }
        return false;
    }

    /** xs with x appended. */
    static <T> Seq<T> with(Seq<T> xs, T x) {
        List<T> all = new ArrayList<>(CollectionConverters.asJava(xs));
        all.add(x);
        return CollectionConverters.asScala(all).toList();
    }

    static Seq<Attribute> append(Seq<Attribute> in, Attribute a) {
        List<Attribute> all = new ArrayList<>(CollectionConverters.asJava(in));
        all.add(a);
        return CollectionConverters.asScala(all).toList();
    }

    static AttributeSet set(Attribute a) {
        return AttributeSet.apply(seq(a));
    }

    /** Where a is among in (by its expression id), or an error naming it. */
    static int indexOf(Seq<Attribute> in, Attribute a) {
        List<Attribute> l = CollectionConverters.asJava(in);
        for (int i = 0; i < l.size(); i++) {
            if (l.get(i).exprId().equals(a.exprId())) {
                return i;
            }
        }
        throw new IllegalStateException("the lookup's key " + a + " is not among its input's columns " + in);
    }

    static StructType schema(Seq<Attribute> in) {
        return DataTypeUtils.fromAttributes(in);
    }
}
