package io.shmcache;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.AccessDeniedException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * A {@link FileOpener} that makes the open of format section 1 itself: {@code open(2)} with
 * {@code O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC} on the caller's thread. No thread, no bound to
 * wait out: an open never blocks (a FIFO opens at once and is then refused), a symbolic link
 * at the name is never followed ({@code ELOOP}), and every check is made on the file that was
 * opened, so a file swapped in at the name between a look and the open cannot be taken for
 * another.
 *
 * <p>After the open, the file is looked at through its descriptor: the JDK's stat of
 * {@code /proc/self/fd/N}, which the kernel answers for the open file itself (that name is a
 * link to it, not to a path), the fstat of this descriptor; only a regular file is kept, and
 * the owner and mode checks ({@link Mapped#open}) are made on that same look. (A downcall to
 * {@code fstat} would read a {@code struct stat} whose layout is per architecture.) The
 * channel the rest of the package reads is then opened through that same name, so it is the
 * same file whatever is at the cache's name by then, and the descriptor is closed.
 *
 * <p>Two ways to call {@code open(2)}, one per JDK: {@link DispatcherOpener} (JDK 17-21, the
 * JDK's own {@code open} of its file-system code) and {@code NativeOpener} (JDK 22+, the
 * foreign function API, src/main/java22).
 */
abstract class DescriptorOpener implements FileOpener {
    static final int O_RDONLY = 0, O_RDWR = 2, O_NONBLOCK = 04000, O_CLOEXEC = 02000000;
    static final int ENOENT = 2, ENXIO = 6, EACCES = 13, EPERM = 1, EISDIR = 21, ELOOP = 40;
    static final Path FDS = Path.of("/proc/self/fd");

    /** O_NOFOLLOW of this architecture's Linux. */
    private final int noFollow;

    DescriptorOpener(int noFollow) {
        this.noFollow = noFollow;
    }

    /**
     * O_NOFOLLOW on this machine's architecture, or null where this package does not know the
     * flags' values or {@code /proc/self/fd} is not there (then no DescriptorOpener serves).
     */
    static Integer noFollow() {
        Integer noFollow = switch (System.getProperty("os.arch", "")) {
            case "amd64", "x86_64" -> 0400000;
            case "aarch64" -> 0100000;
            default -> null;
        };
        return noFollow != null && Files.isDirectory(FDS) ? noFollow : null;
    }

    /**
     * {@code open(2)} of path with flags (and mode 0): the descriptor, or minus the errno it
     * failed with. Any other failure (the call could not be made) is a RuntimeException.
     */
    abstract int openFd(Path path, int flags);

    /** {@code close(2)} of a descriptor {@link #openFd} returned; never throws. */
    abstract void closeFd(int fd);

    @Override
    public final Opened open(String cache, Path path, boolean write, String what) {
        int fd;
        try {
            fd = openFd(path, (write ? O_RDWR : O_RDONLY) | O_NONBLOCK | noFollow | O_CLOEXEC);
        } catch (RuntimeException e) {
            throw new ShmcacheException.NotACache(cache, "cannot open " + path + what + ": " + e, e);
        }
        if (fd < 0) {
            throw refused(cache, path, write, what, -fd);
        }
        try {
            Path self = FDS.resolve(Integer.toString(fd));
            FileStat st;
            try {
                st = FileStat.ofOpen(self);
            } catch (IOException e) {
                throw new ShmcacheException.NotACache(cache, "cannot look at " + path + what + " once opened: " + e, e);
            }
            if (!st.isRegular()) { // a FIFO, a directory, a socket: never read
                throw new ShmcacheException.NotACache(cache, path + what + " is " + st.type() + ", not a shmcache file");
            }
            try {
                FileChannel ch = write ? FileChannel.open(self, StandardOpenOption.READ, StandardOpenOption.WRITE)
                        : FileChannel.open(self, StandardOpenOption.READ);
                return new Opened(ch, st);
            } catch (AccessDeniedException e) {
                throw ThreadOpener.denied(cache, path, what, write, st, e);
            } catch (IOException e) {
                throw new ShmcacheException.NotACache(cache, "cannot open " + path + what + ": " + e, e);
            }
        } finally {
            closeFd(fd);
        }
    }

    /** The error of an open that failed with errno err. */
    private static ShmcacheException refused(String cache, Path path, boolean write, String what, int err) {
        FileStat now;
        try {
            now = FileStat.of(path);
        } catch (IOException e) {
            now = null;
        }
        return switch (err) {
            case ENOENT -> ThreadOpener.notFound(cache, path, what);
            case EACCES, EPERM -> now != null ? ThreadOpener.denied(cache, path, what, write, now, null)
                    : new ShmcacheException.Permission(cache, "permission denied opening " + path + what, null);
            case ELOOP -> new ShmcacheException.NotACache(cache, path + what + " is a symbolic link, not a shmcache "
                    + "file");
            case ENXIO, EISDIR -> new ShmcacheException.NotACache(cache, path + what + " is "
                    + (now == null ? "not a regular file" : now.type()) + ", not a shmcache file");
            default -> new ShmcacheException.NotACache(cache, "cannot open " + path + what + ": errno " + err
                    + (now == null ? "" : "; it holds " + now.type()));
        };
    }
}
