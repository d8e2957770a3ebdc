package io.shmcache;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.AccessDeniedException;
import java.nio.file.FileSystemException;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.SynchronousQueue;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The {@link FileOpener} of Java 17, whose NIO has no {@code O_NONBLOCK}: an open of a FIFO
 * blocks until a writer opens it, which may be never. So every open runs on a daemon opener
 * thread and the caller waits for it at most {@link #WAIT_NS}:
 * <ul>
 * <li>the opener looks at the name first ({@code lstat}) and opens only a regular file, with
 *     {@code O_NOFOLLOW}; then looks again and keeps the file only if the name still holds the same regular file
 *     (the stand-in for the {@code fstat} Java 17 lacks: a file swapped out and back between
 *     the two looks goes unseen);
 * <li>a FIFO swapped in between the look and the open blocks the opener, not the caller:
 *     after the bound the caller gets {@link ShmcacheException.NotACache} naming what is at
 *     the name now, and the opener stays blocked until a writer opens that FIFO (then it
 *     closes what it got and is free again);
 * <li>at most {@link #MAX_BLOCKED} openers may be blocked at once in this JVM, and
 *     {@link #MAX_BLOCKED_AT_A_NAME} on one name: past that, an open of the name (of any
 *     name) fails at once, saying so, instead of leaving another thread behind.
 * </ul>
 * A lookup never opens anything: only an attach and a handle's look at its name (at most
 * every 0.1 s, never holding up other threads' lookups: {@link Segment#check()}) do, so the
 * bound is spent only while the name holds something that is not a cache.
 */
final class ThreadOpener implements FileOpener {
    /** How long a caller waits for an open: a regular file on tmpfs opens in microseconds. */
    static final long WAIT_NS = 2_000_000_000L;
    static final int MAX_BLOCKED = 8;
    static final int MAX_BLOCKED_AT_A_NAME = 2;

    private final ThreadPoolExecutor pool;
    private final AtomicInteger blocked = new AtomicInteger();
    private final ConcurrentHashMap<Path, AtomicInteger> blockedAt = new ConcurrentHashMap<>();

    ThreadOpener() {
        AtomicInteger n = new AtomicInteger();
        pool = new ThreadPoolExecutor(0, Integer.MAX_VALUE, 30, TimeUnit.SECONDS, new SynchronousQueue<>(), r -> {
            Thread t = new Thread(r, "shmcache-opener-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        });
    }

    /** Openers blocked now (tests). */
    int blocked() {
        return blocked.get();
    }

    @Override
    public Opened open(String cache, Path path, boolean write, String what) {
        AtomicInteger here = blockedAt.computeIfAbsent(path, p -> new AtomicInteger());
        if (here.get() >= MAX_BLOCKED_AT_A_NAME || blocked.get() >= MAX_BLOCKED) {
            throw new ShmcacheException.NotACache(cache, path + what + " is not opened: " + here.get() + " earlier opens "
                    + "of it (" + blocked.get() + " of any name) are still blocked, each on a FIFO swapped in at the name "
                    + "while it was opened; now " + describe(path));
        }
        CompletableFuture<Opened> f = CompletableFuture.supplyAsync(() -> openNow(cache, path, write, what), pool);
        long deadline = System.nanoTime() + WAIT_NS;
        boolean interrupted = false;
        try {
            while (true) {
                try {
                    return f.get(Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
                } catch (InterruptedException e) {
                    interrupted = true; // the wait is bounded: finish it, and leave the interrupt to the caller
                } catch (ExecutionException e) {
                    Throwable c = e.getCause();
                    if (c instanceof ShmcacheException se) {
                        throw se;
                    }
                    throw new ShmcacheException.NotACache(cache, "cannot open " + path + what + ": " + c, c);
                } catch (TimeoutException e) {
                    blocked.incrementAndGet();
                    here.incrementAndGet();
                    f.whenComplete((o, t) -> { // a writer opened the FIFO at last: this opener is free again
                        if (o != null) {
                            o.close();
                        }
                        here.decrementAndGet();
                        blocked.decrementAndGet();
                    });
                    throw new ShmcacheException.NotACache(cache, path + what + " did not open within "
                            + WAIT_NS / 1_000_000_000L + " s (a FIFO swapped in at the name while it was opened): not "
                            + "a shmcache file; now " + describe(path));
                }
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    private static String describe(Path path) {
        try {
            FileStat s = FileStat.of(path);
            return s == null ? "nothing is there" : "it holds " + s.type();
        } catch (IOException e) {
            return "it cannot be looked at (" + e.getMessage() + ")";
        }
    }

    /** The open itself, on an opener thread. */
    private static Opened openNow(String cache, Path path, boolean write, String what) {
        FileStat before = stat(cache, path, what);
        if (before == null) {
            throw notFound(cache, path, what);
        }
        if (!before.isRegular()) { // a FIFO, a directory, a link: never opened, never followed
            throw new ShmcacheException.NotACache(cache, path + what + " is " + before.type()
                    + ", not a shmcache file");
        }
        FileChannel ch;
        try {
            ch = write ? FileChannel.open(path, StandardOpenOption.READ, StandardOpenOption.WRITE, LinkOption.NOFOLLOW_LINKS)
                    : FileChannel.open(path, StandardOpenOption.READ, LinkOption.NOFOLLOW_LINKS);
        } catch (NoSuchFileException e) {
            throw notFound(cache, path, what);
        } catch (AccessDeniedException e) {
            throw denied(cache, path, what, write, before, e);
        } catch (FileSystemException e) { // ELOOP: a symbolic link swapped in at the name
            throw new ShmcacheException.NotACache(cache, "cannot open " + path + what + ": " + e.getReason()
                    + "; now " + describe(path), e);
        } catch (IOException e) {
            throw new ShmcacheException.NotACache(cache, "cannot open " + path + what + ": " + e, e);
        }
        Opened o = new Opened(ch, before);
        FileStat after;
        try {
            after = stat(cache, path, what);
        } catch (ShmcacheException e) {
            after = null;
        }
        if (after == null || !after.isRegular() || !after.sameFile(before)) {
            o.close();
            throw new ShmcacheException.NotACache(cache, path + what + " was replaced while it was being opened: not "
                    + "read; now " + describe(path));
        }
        return new Opened(ch, after);
    }

    static ShmcacheException.Permission denied(String cache, Path path, String what, boolean write,
                                                       FileStat before, Exception e) {
        return new ShmcacheException.Permission(cache, "permission denied opening " + path + what + " for "
                + (write ? "reading and writing" : "reading") + " (mode " + String.format("%04o", before.perms())
                + ", owner " + Users.text(before.uid()) + ")", e);
    }

    private static FileStat stat(String cache, Path path, String what) {
        try {
            return FileStat.of(path);
        } catch (AccessDeniedException e) {
            throw new ShmcacheException.Permission(cache, "permission denied looking at " + path + what, e);
        } catch (IOException e) {
            throw new ShmcacheException.NotACache(cache, "cannot look at " + path + what + ": " + e, e);
        }
    }

    static ShmcacheException.NotFound notFound(String cache, Path path, String what) {
        return new ShmcacheException.NotFound(cache, "does not exist (no " + path + what + ")");
    }
}
