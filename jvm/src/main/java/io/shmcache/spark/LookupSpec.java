package io.shmcache.spark;

import java.io.Serializable;
import org.apache.spark.sql.catalyst.expressions.Attribute;

/**
 * What a lookup node looks up: the key column, the cache, the owner (null: any user's), the
 * column it adds, and whether that column is the value (binary) or only found (boolean).
 * Serializable, as the physical plan that carries it ({@link LookupExec}) may be.
 */
record LookupSpec(Attribute key, String cache, String owner, Attribute out, boolean values) implements Serializable {
    /** The node as explain() shows it. */
    String describe(String node) {
        return node + " shmcache lookup of '" + key.name() + "' in cache '" + cache + "'"
                + (owner == null ? "" : " (owner " + owner + ")") + ": " + (values ? "value" : "found") + " as " + out;
    }
}
