package io.shmcache;

import static java.lang.invoke.MethodType.methodType;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.reflect.Field;
import java.nio.file.Path;
import sun.misc.Unsafe;

/**
 * The {@link DescriptorOpener} of JDK 17-21, whose public API cannot open with
 * {@code O_NONBLOCK} nor fstat what it opened: it calls the JDK's own {@code open(2)}, the
 * one its file-system code makes every open with ({@code sun.nio.fs.UnixNativeDispatcher}'s
 * {@code open(UnixPath, int flags, int mode)}, which throws a {@code UnixException} carrying
 * the errno), and its {@code close(int)}.
 *
 * <p>Those are package-private to {@code java.base}, which does not open its package to
 * this code; they are reached through the JDK's trusted method-handle lookup
 * ({@code MethodHandles.Lookup.IMPL_LOOKUP}), read once with {@code sun.misc.Unsafe}, which
 * this JDK's path already reads memory with ({@link UnsafeMapping}). Both have had these
 * names and types since JDK 7. Where any of it is missing (another JVM's class library),
 * {@link #ifUsable()} says so, and {@link ThreadOpener} serves instead.
 */
final class DispatcherOpener extends DescriptorOpener {
    private final MethodHandle open;  // (Path, int flags, int mode) -> fd, or throws UnixException
    private final MethodHandle close; // (int fd) -> void
    private final Class<?> unixException;
    private final MethodHandle errno; // (Throwable, a UnixException) -> its errno

    private DispatcherOpener(int noFollow, MethodHandle open, MethodHandle close, Class<?> unixException,
                             MethodHandle errno) {
        super(noFollow);
        this.open = open;
        this.close = close;
        this.unixException = unixException;
        this.errno = errno;
    }

    /** The opener, or null where it cannot serve (see the class comment). */
    static DispatcherOpener ifUsable() {
        Integer noFollow = noFollow();
        if (noFollow == null) {
            return null;
        }
        try {
            Field f = MethodHandles.Lookup.class.getDeclaredField("IMPL_LOOKUP");
            Unsafe u = UnsafeMapping.U;
            MethodHandles.Lookup trusted = (MethodHandles.Lookup) u.getObject(u.staticFieldBase(f), u.staticFieldOffset(f));
            Class<?> dispatcher = Class.forName("sun.nio.fs.UnixNativeDispatcher");
            Class<?> unixPath = Class.forName("sun.nio.fs.UnixPath");
            Class<?> unixException = Class.forName("sun.nio.fs.UnixException");
            MethodHandle open = trusted.findStatic(dispatcher, "open", methodType(int.class, unixPath, int.class,
                    int.class)).asType(methodType(int.class, Path.class, int.class, int.class));
            MethodHandle close = trusted.findStatic(dispatcher, "close", methodType(void.class, int.class));
            MethodHandle errno = trusted.findVirtual(unixException, "errno", methodType(int.class))
                    .asType(methodType(int.class, Throwable.class));
            if (!unixPath.isInstance(Path.of("/"))) {
                return null; // another file system than the JDK's Unix one
            }
            return new DispatcherOpener(noFollow, open, close, unixException, errno);
        } catch (ReflectiveOperationException | RuntimeException | LinkageError e) {
            return null;
        }
    }

    @Override
    int openFd(Path path, int flags) {
        try {
            return (int) open.invokeExact(path, flags, 0);
        } catch (Error e) {
            throw e;
        } catch (Throwable t) {
            if (!unixException.isInstance(t)) {
                throw new IllegalStateException("open(2) through the JDK failed", t);
            }
            try {
                return -(int) errno.invokeExact(t);
            } catch (Throwable e) {
                throw new IllegalStateException("the errno of " + t, e);
            }
        }
    }

    @Override
    void closeFd(int fd) {
        try {
            close.invokeExact(fd);
        } catch (Throwable ignored) {
            // a descriptor nothing reads: close(2) fails only for a bad one
        }
    }
}
