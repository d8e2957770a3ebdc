package io.shmcache;

import java.io.IOException;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.VarHandle;
import java.nio.channels.FileChannel;
import java.nio.file.AccessDeniedException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

/**
 * The {@link FileOpener} of JDK 22+: {@code open(2)} with {@code O_NONBLOCK | O_NOFOLLOW |
 * O_CLOEXEC}, called through the foreign function API on the caller's thread. No thread, no
 * bound to wait out: an open never blocks (a FIFO opens at once and is then refused), a
 * symbolic link at the name is never followed ({@code ELOOP}), and what was opened is
 * looked at after the open, so a file swapped in at the name between a look and the open
 * cannot be taken for another.
 *
 * <p>After the open, the file is looked at through its descriptor: the JDK's stat of
 * {@code /proc/self/fd/N}, which the kernel answers for the open file itself (that name is
 * a link to it, not to a path), the fstat of this descriptor; only a regular file is kept.
 * (A downcall to {@code fstat} would read a {@code struct stat} whose layout is per
 * architecture, from a symbol glibc exports only since 2.33.) The channel the rest of the
 * package reads is then opened through that same name, so it is the same file whatever is at
 * the cache's name by then, and the descriptor is closed.
 *
 * <p>Used where it can be ({@link #ifUsable()}): this class's module may call native code
 * (without that, the first downcall would print the JVM's warning about restricted
 * methods), the C library has {@code open} and {@code close}, the flags' values are known
 * for this architecture (x86-64, AArch64), and {@code /proc/self/fd} is there. Elsewhere
 * {@link ThreadOpener} serves, as on JDK 17.
 */
final class NativeOpener implements FileOpener {
    private static final int O_RDONLY = 0, O_RDWR = 2, O_NONBLOCK = 04000, O_CLOEXEC = 02000000;
    private static final int ENOENT = 2, EINTR = 4, ENXIO = 6, EACCES = 13, EPERM = 1, EISDIR = 21, ELOOP = 40;
    private static final Path FDS = Path.of("/proc/self/fd");

    private final int noFollow;
    private final MethodHandle open, close;
    private final StructLayout captured = Linker.Option.captureStateLayout();
    private final VarHandle errno = captured.varHandle(StructLayout.PathElement.groupElement("errno"));

    private NativeOpener(int noFollow, MethodHandle open, MethodHandle close) {
        this.noFollow = noFollow;
        this.open = open;
        this.close = close;
    }

    /** The opener, or null where it cannot serve (see the class comment). */
    static NativeOpener ifUsable() {
        Integer noFollow = switch (System.getProperty("os.arch", "")) {
            case "amd64", "x86_64" -> 0400000;
            case "aarch64" -> 0100000;
            default -> null;
        };
        if (noFollow == null || !NativeOpener.class.getModule().isNativeAccessEnabled() || !Files.isDirectory(FDS)) {
            return null;
        }
        try {
            Linker linker = Linker.nativeLinker();
            var libc = linker.defaultLookup();
            MethodHandle open = linker.downcallHandle(libc.find("open").orElseThrow(),
                    FunctionDescriptor.of(ValueLayout.JAVA_INT, ValueLayout.ADDRESS, ValueLayout.JAVA_INT,
                            ValueLayout.JAVA_INT),
                    Linker.Option.firstVariadicArg(2), Linker.Option.captureCallState("errno"));
            MethodHandle close = linker.downcallHandle(libc.find("close").orElseThrow(),
                    FunctionDescriptor.of(ValueLayout.JAVA_INT, ValueLayout.JAVA_INT));
            return new NativeOpener(noFollow, open, close);
        } catch (RuntimeException e) { // no such symbol, or native access refused after all
            return null;
        }
    }

    @Override
    public Opened open(String cache, Path path, boolean write, String what) {
        int fd, err;
        try (Arena a = Arena.ofConfined()) {
            MemorySegment name = a.allocateFrom(path.toString());
            MemorySegment state = a.allocate(captured);
            int flags = (write ? O_RDWR : O_RDONLY) | O_NONBLOCK | noFollow | O_CLOEXEC;
            do {
                fd = (int) open.invokeExact(state, name, flags, 0);
                err = fd < 0 ? (int) errno.get(state, 0L) : 0;
            } while (fd < 0 && err == EINTR);
        } catch (Throwable t) {
            throw new ShmcacheException.NotACache(cache, "cannot open " + path + what + ": " + t, t);
        }
        if (fd < 0) {
            throw refused(cache, path, write, what, err);
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
            try {
                int rc = (int) close.invokeExact(fd);
            } catch (Throwable ignored) {
                // a descriptor nothing reads: close(2) fails only for a bad one
            }
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
