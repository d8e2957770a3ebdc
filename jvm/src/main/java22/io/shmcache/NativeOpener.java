package io.shmcache;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.VarHandle;
import java.nio.file.Path;

/**
 * The {@link DescriptorOpener} of JDK 22+: {@code open(2)} and {@code close(2)} of the C
 * library, called through the foreign function API on the caller's thread, the errno
 * captured with the call.
 *
 * <p>Used where it can be ({@link #ifUsable()}): this class's module may call native code
 * (without that, the first downcall would print the JVM's warning about restricted
 * methods), the C library has {@code open} and {@code close}, the flags' values are known
 * for this architecture (x86-64, AArch64), and {@code /proc/self/fd} is there. Elsewhere
 * {@link ThreadOpener} serves.
 */
final class NativeOpener extends DescriptorOpener {
    private static final int EINTR = 4;

    private final MethodHandle open, close;
    private final StructLayout captured = Linker.Option.captureStateLayout();
    private final VarHandle errno = captured.varHandle(StructLayout.PathElement.groupElement("errno"));

    private NativeOpener(int noFollow, MethodHandle open, MethodHandle close) {
        super(noFollow);
        this.open = open;
        this.close = close;
    }

    /** The opener, or null where it cannot serve (see the class comment). */
    static NativeOpener ifUsable() {
        Integer noFollow = noFollow();
        if (noFollow == null || !NativeOpener.class.getModule().isNativeAccessEnabled()) {
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
    int openFd(Path path, int flags) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment name = a.allocateFrom(path.toString());
            MemorySegment state = a.allocate(captured);
            while (true) {
                int fd = (int) open.invokeExact(state, name, flags, 0);
                int err = fd < 0 ? (int) errno.get(state, 0L) : 0;
                if (fd >= 0 || err != EINTR) {
                    return fd >= 0 ? fd : -err;
                }
            }
        } catch (RuntimeException | Error e) {
            throw e;
        } catch (Throwable t) {
            throw new IllegalStateException("open(2) failed", t);
        }
    }

    @Override
    void closeFd(int fd) {
        try {
            int rc = (int) close.invokeExact(fd);
        } catch (Throwable ignored) {
            // a descriptor nothing reads: close(2) fails only for a bad one
        }
    }
}
