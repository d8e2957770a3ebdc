package io.shmcache.spark;

import org.apache.spark.sql.api.java.UDF3;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The same lookups as Java UDFs (spark.udf.registerJavaFunction), kept to measure against
 * the Catalyst expression of {@link Functions} (bench/test_jvm_lookup.py): arguments are
 * (cache, key as binary or hex string, key column name). Spark converts each row's values
 * to Java objects and back for a UDF, which the expression does not.
 */
public final class JavaUdfs {
    private JavaUdfs() {}

    /** (cache, key, column) -> value or null. */
    public static final class Get implements UDF3<String, Object, String, byte[]> {
        private static final long serialVersionUID = 1L;

        @Override
        public byte[] call(String cache, Object key, String column) {
            UTF8String c = UTF8String.fromString(cache), col = UTF8String.fromString(column);
            return key instanceof String
                    ? Lookups.getHex(c, UTF8String.fromString((String) key), col)
                    : Lookups.get(c, (byte[]) key, col);
        }
    }

    /** (cache, key, column) -> found. */
    public static final class Contains implements UDF3<String, Object, String, Boolean> {
        private static final long serialVersionUID = 1L;

        @Override
        public Boolean call(String cache, Object key, String column) {
            UTF8String c = UTF8String.fromString(cache), col = UTF8String.fromString(column);
            return key instanceof String
                    ? Lookups.containsHex(c, UTF8String.fromString((String) key), col)
                    : Lookups.contains(c, (byte[]) key, col);
        }
    }
}
