package io.shmcache;

/**
 * A file cut short under a mapping, and the JVM's way of reporting it (format section 4: a
 * reader turns it into an error of the call that met it, and never dies of it).
 *
 * <p>A load from a page the file lost raises SIGBUS. HotSpot's handler sees that the
 * faulting instruction is an unsafe access (an {@code Unsafe} load in compiled code, or one
 * the VM made for a native method), skips it (the load returns garbage) and asks for an
 * asynchronous {@link InternalError} ("a fault occurred in a (recent) unsafe memory access
 * operation"), which the thread throws later, at a point that depends on the JDK:
 * <ul>
 * <li>JDK 17: the request is a flag of the thread ({@code set_pending_unsafe_access_error}),
 *     thrown at the thread's next return from the VM's runtime to Java code with asynchronous
 *     exceptions checked: a runtime call of compiled code (an allocation's slow path, a
 *     call's resolution, an uncommon trap), an interpreter call into the runtime, a return
 *     poll. Not at a loop's safepoint poll in compiled code (the frame is deoptimized and the
 *     error left for the interpreter), and not at the return from a native method
 *     ({@code check_special_condition_for_native_trans} leaves the unsafe-access error for
 *     later). Left alone, it lands wherever the thread is next, in or out of this package.
 * <li>JDK 21 and later: the request is an asynchronous handshake of the thread
 *     ({@code UnsafeAccessErrorHandshake}), which arms its safepoint poll: it is thrown at the
 *     thread's next poll, and at the latest at its next return from a native method (that
 *     transition processes handshakes with asynchronous exceptions).
 * </ul>
 * So every call of this package that read a mapping ends, inside its own {@code try}, with
 * {@link #seal}: on JDK 21+ a native call, which throws any pending error there; on JDK 17
 * an {@code fstat} of the mapped file ({@code RandomAccessFile.length()}, one native call
 * with no Java code of the JDK around it, where an asynchronous error could land in the
 * middle of the JDK's own bookkeeping, as it does in {@code FileChannel.size()}): a file
 * shorter than its mapping is a file cut short, and then {@link #drain} makes the pending
 * error be thrown here, before the call returns. Either way the error meets the
 * call's {@code catch}, which turns it into {@link ShmcacheException.Corrupt} ("cut short").
 * After that, the handle marks its mapping lost and never reads it again: one error per
 * thread that met the lost pages, each inside the call that met them.
 *
 * <p>Not covered on JDK 17: a file cut short and grown back to its size between a call's
 * loads and its {@code fstat} (the pending error then surfaces later, outside this package).
 */
final class Faults {
    private Faults() {}

    /** Whether the JVM throws an unsafe access's error at the next native-to-Java transition (JDK 21+). */
    static final boolean AT_TRANSITION = Runtime.version().feature() >= 21;

    /** Whether e is the JVM's report of a fault in an unsafe memory access (a file cut short under a mapping). */
    static boolean isFault(Throwable e) {
        return e instanceof InternalError && e.getMessage() != null && e.getMessage().contains("unsafe memory access");
    }

    /** A native call whose return to Java throws a pending unsafe-access error (JDK 21+); nothing else. */
    static void transition() {
        Runtime.getRuntime().maxMemory();
    }

    /** A length no array may have: read, never folded, so every allocation of it goes to the runtime. */
    private static volatile int negative = -1;

    /**
     * Makes this thread throw now the unsafe-access error its loads may have left pending.
     * On JDK 17 such an error is thrown only by a call from Java code into the VM's runtime,
     * on the way back (its {@code ThreadInVMfromJava} checks asynchronous conditions), never
     * at a loop's safepoint poll in compiled code (there it defers to the interpreter) nor at
     * a native method's return. An array of negative length is made by the runtime in every
     * mode ({@code InterpreterRuntime::newarray}; C1's {@code Runtime1::new_type_array}; C2's
     * allocation slow path, or an uncommon trap), so allocating one throws the pending error
     * here, inside the caller's {@code try}; when the runtime has its own exception to throw
     * already, the pending error is discarded: either way none is left to surface later.
     * Called only on the way out of a call that found its file cut short.
     */
    static void drain() {
        try {
            if (new byte[negative].length >= 0) { // never: the allocation throws
                throw new IllegalStateException("an array of negative length");
            }
        } catch (NegativeArraySizeException expected) {
            // the runtime made it: any pending error was thrown (or discarded) on its way back
        }
    }
}
