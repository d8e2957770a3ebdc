package io.shmcache;

/**
 * Every error of this package: each names the cache (its name, or a path for
 * {@link Segment#attachPath}) and what was wrong. The kinds are the nested classes, as
 * the Python engine's errors are (shmcache.errors).
 */
public class ShmcacheException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final String cache;

    ShmcacheException(String cache, String message, Throwable cause) {
        this(cache, message, cause, false);
    }

    /** whole: the message is given whole (it names the cache itself), with no prefix added. */
    ShmcacheException(String cache, String message, Throwable cause, boolean whole) {
        super(whole ? message : "shmcache: cache '" + cache + "': " + message, cause);
        this.cache = cache;
    }

    /** The cache's name (or path) the error is about. */
    public String cache() {
        return cache;
    }

    /** Nothing at the name (or it went away): Python's CacheNotFoundError. */
    public static final class NotFound extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        public NotFound(String cache, String message) { super(cache, message, null); }
        /** A message given whole, naming the cache itself (Spark's errors, worded as the Python lookup's). */
        public NotFound(String cache, String message, boolean whole) { super(cache, message, null, whole); }
    }

    /** A file that is not a shmcache segment (no magic, bad magic, not a regular file, too small). */
    public static class NotACache extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        NotACache(String cache, String message) { super(cache, message, null); }
        NotACache(String cache, String message, Throwable cause) { super(cache, message, cause); }
    }

    /** A segment of a layout version this reader does not read (section 5). */
    public static final class Version extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        Version(String cache, String message) { super(cache, message, null); }
    }

    /** A damaged segment: a header field out of bounds (field() names it), or a file cut short. */
    public static final class Corrupt extends NotACache {
        private static final long serialVersionUID = 1L;
        private final String field;
        Corrupt(String cache, String field, String message, Throwable cause) {
            super(cache, message, cause);
            this.field = field;
        }
        /** The header field that failed its check, null for a file cut short. */
        public String field() { return field; }
    }

    /**
     * The cache's file belongs to another user than the reader was told to expect
     * ({@link Segment#attach(String, Owner)}): Python's CacheOwnerError. Nothing of the file was read.
     */
    public static final class WrongOwner extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        WrongOwner(String cache, String message) { super(cache, message, null); }
        /** The same refusal again (a lookup of a handle whose cache was re-created by another user). */
        WrongOwner(WrongOwner first) { super(first.cache(), first.getMessage(), null, true); }
    }

    /** A key that is not the cache's key size. */
    public static final class KeySize extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        public KeySize(String cache, String message) { super(cache, message, null); }
        /** A message given whole, naming the cache itself. */
        public KeySize(String cache, String message, boolean whole) { super(cache, message, null, whole); }
    }

    /** A handle used after close(). */
    public static final class Closed extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        Closed(String cache) { super(cache, "this handle is closed", null); }
    }
}
