package io.shmcache;

/**
 * Every error of this package: each names the cache (its name, or a path for
 * {@link Segment#attachPath}) and what was wrong. The kinds are the nested classes, as
 * the Python engine's errors are (shmcache.errors), and {@link #kind()} is the word the
 * readers' command contract gives each (docs/reader-contract.md, "Errors"): the same word
 * for the same case in the Python, Go and Java readers.
 */
public abstract class ShmcacheException extends RuntimeException {
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

    /**
     * The contract's word for this error: {@code not-found}, {@code not-a-cache},
     * {@code corrupt}, {@code unknown-version}, {@code wrong-owner}, {@code unsafe-mode},
     * {@code permission}, {@code bad-argument} or {@code not-ready}: each kind of error names
     * its own (ContractTest holds them to golden/contract.json), none falls back to another.
     */
    public abstract String kind();

    /**
     * The same error again, thrown anew (a handle that follows a name throws what is at the
     * name on every lookup while it is there): the same kind and message, this stack.
     */
    abstract ShmcacheException again();

    /** Nothing at the name (or it went away): Python's CacheNotFoundError. */
    public static final class NotFound extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        public NotFound(String cache, String message) { super(cache, message, null); }
        /** A message given whole, naming the cache itself (Spark's errors, worded as the Python lookup's). */
        public NotFound(String cache, String message, boolean whole) { super(cache, message, null, whole); }
        @Override public String kind() { return "not-found"; }
        @Override NotFound again() { return new NotFound(cache(), getMessage(), true); }
    }

    /** A file that is not a shmcache segment (no magic, bad magic, not a regular file, too small). */
    public static class NotACache extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        NotACache(String cache, String message) { super(cache, message, null); }
        NotACache(String cache, String message, Throwable cause) { super(cache, message, cause); }
        NotACache(String cache, String message, Throwable cause, boolean whole) { super(cache, message, cause, whole); }
        @Override public String kind() { return "not-a-cache"; }
        @Override NotACache again() { return new NotACache(cache(), getMessage(), getCause(), true); }
    }

    /** A segment of a layout version this reader does not read (section 5). */
    public static final class Version extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        Version(String cache, String message) { super(cache, message, null); }
        private Version(String cache, String message, boolean whole) { super(cache, message, null, whole); }
        @Override public String kind() { return "unknown-version"; }
        @Override Version again() { return new Version(cache(), getMessage(), true); }
    }

    /** A damaged segment: a header field out of bounds (field() names it), or a file cut short. */
    public static final class Corrupt extends NotACache {
        private static final long serialVersionUID = 1L;
        private final String field;
        Corrupt(String cache, String field, String message, Throwable cause) {
            this(cache, field, message, cause, false);
        }
        private Corrupt(String cache, String field, String message, Throwable cause, boolean whole) {
            super(cache, message, cause, whole);
            this.field = field;
        }
        /** The header field that failed its check, null for a file cut short. */
        public String field() { return field; }
        @Override public String kind() { return "corrupt"; }
        @Override Corrupt again() { return new Corrupt(cache(), field, getMessage(), getCause(), true); }
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
        @Override public String kind() { return "wrong-owner"; }
        @Override WrongOwner again() { return new WrongOwner(this); }
    }

    /**
     * The cache's file lets its group or others write it (format section 4): anyone could
     * have put its content there, so it is refused, owner named or not (Python's UnsafeModeError).
     */
    public static final class UnsafeMode extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        UnsafeMode(String cache, String message) { super(cache, message, null); }
        private UnsafeMode(String cache, String message, boolean whole) { super(cache, message, null, whole); }
        @Override public String kind() { return "unsafe-mode"; }
        @Override UnsafeMode again() { return new UnsafeMode(cache(), getMessage(), true); }
    }

    /** This process may not open the cache's file (Python's CachePermissionError). */
    public static final class Permission extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        Permission(String cache, String message, Throwable cause) { super(cache, message, cause); }
        private Permission(String cache, String message, Throwable cause, boolean whole) {
            super(cache, message, cause, whole);
        }
        @Override public String kind() { return "permission"; }
        @Override Permission again() { return new Permission(cache(), getMessage(), getCause(), true); }
    }

    /** A name that is not a cache's name ("../x"): never looked up (format section 1). */
    public static final class BadName extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        BadName(String cache, String message) { super(cache, message, null); }
        private BadName(String cache, String message, boolean whole) { super(cache, message, null, whole); }
        @Override public String kind() { return "bad-argument"; }
        @Override BadName again() { return new BadName(cache(), getMessage(), true); }
    }

    /** A key that is not the cache's key size. */
    public static final class KeySize extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        public KeySize(String cache, String message) { super(cache, message, null); }
        /** A message given whole, naming the cache itself. */
        public KeySize(String cache, String message, boolean whole) { super(cache, message, null, whole); }
        @Override public String kind() { return "bad-argument"; }
        @Override KeySize again() { return new KeySize(cache(), getMessage(), true); }
    }

    /**
     * {@link Segment#waitReady} gave up: the cache did not hold its whole topic by the
     * timeout; the message says why not (Python's CacheNotReadyError).
     */
    public static final class NotReady extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        private final transient Status status;
        NotReady(String cache, String message, Status status) {
            super(cache, message, null, true);
            this.status = status;
        }
        /** The last status read (null if the cache was not there). */
        public Status status() { return status; }
        @Override public String kind() { return "not-ready"; }
        @Override NotReady again() { return new NotReady(cache(), getMessage(), status); }
    }

    /** A handle used after close(). */
    public static final class Closed extends ShmcacheException {
        private static final long serialVersionUID = 1L;
        Closed(String cache) { super(cache, "this handle is closed", null); }
        private Closed(Closed first) { super(first.cache(), first.getMessage(), null, true); }
        /** A bad argument, as Python's ClosedError and Go's ErrClosed are: the caller's handle. */
        @Override public String kind() { return "bad-argument"; }
        @Override Closed again() { return new Closed(this); }
    }
}
