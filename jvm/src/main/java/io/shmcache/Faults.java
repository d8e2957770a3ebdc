package io.shmcache;

/**
 * A file cut short under a mapping, and the JVM's way of reporting it (format section 4: a
 * reader turns it into an error of the call that met it, and never dies of it).
 *
 * <p>A load from a page the file lost raises SIGBUS. HotSpot's handler sees that the
 * faulting instruction is an unsafe access (an {@code Unsafe} load in compiled code, one the
 * VM made for a native method, or one of its unsafe copy stubs), skips it (the load returns
 * garbage) and asks for an asynchronous {@link InternalError} ("a fault occurred in a
 * (recent) unsafe memory access operation"), which the thread throws later, at a point that
 * depends on the JDK. A {@code MemorySegment} access (the JDK 22+ mapping,
 * {@code SegmentMapping}) is one of these too: the JDK makes it through
 * {@code jdk.internal.misc.ScopedMemoryAccess}, whose loads are the same Unsafe intrinsics in
 * compiled code (the compiled method is marked as making unsafe accesses, which is what the
 * handler looks for) and whose bulk copy is the same stub; the JDK catches nothing on the way
 * but its own closed-scope error, so the InternalError is the same, thrown the same way:
 * <ul>
 * <li>JDK 17: the request is a flag of the thread ({@code set_pending_unsafe_access_error}),
 *     thrown at the thread's next return from the VM's runtime to Java code with asynchronous
 *     exceptions checked ({@code ThreadInVMfromJava}): a runtime call of compiled code (an
 *     allocation's slow path, a call's resolution, an uncommon trap), an interpreter call
 *     into the runtime. Not at a loop's safepoint poll in compiled code (the frame is
 *     deoptimized and the error left for the interpreter), and not at the return from a
 *     native method ({@code check_special_condition_for_native_trans} leaves the unsafe-access
 *     error for later). Left alone, it lands wherever the thread is next, in or out of this
 *     package, even in the middle of the JDK's own bookkeeping (in {@code FileChannel.size()}
 *     it was seen to be replaced by an ArrayIndexOutOfBoundsException).
 * <li>JDK 21 and later: the request is an asynchronous handshake of the thread
 *     ({@code UnsafeAccessErrorHandshake}), which arms its safepoint poll: it is thrown at a
 *     later poll, and at the latest at the thread's next return from a native method (that
 *     transition processes handshakes with asynchronous exceptions).
 * </ul>
 * So every call of this package that read a mapping ends, inside its own {@code try}, with
 * {@link #seal()}, a step that throws any pending error there: on JDK 21+ a native call
 * ({@link #transition()}); before, a round trip through the runtime ({@link #roundTrip()}: a
 * two-dimensional array whose first length the compiler cannot know is made by the runtime in
 * every mode, and the runtime's return to Java throws the pending error). The error meets the
 * call's {@code catch}, which turns it into {@link ShmcacheException.Corrupt} ("cut short")
 * and marks the mapping lost: it is never read again, one error per thread that met the lost
 * pages, each inside the call that met them. A call whose loads met no lost page read what
 * the file held, and the handle's look at its name (at least every 0.1 s) finds the file
 * shorter and marks the mapping lost all the same.
 */
final class Faults {
    private Faults() {}

    /** Whether the JVM throws an unsafe access's error at the next native-to-Java transition (JDK 21+). */
    static final boolean AT_TRANSITION = Runtime.version().feature() >= 21;

    /**
     * Whether e is the JVM's report of a fault in an unsafe memory access (a file cut short
     * under a mapping), or a read a mapping could not serve ({@link Mapping.Unmappable}).
     */
    static boolean isFault(Throwable e) {
        return e instanceof Mapping.Unmappable || e instanceof InternalError && e.getMessage() != null && e.getMessage().contains("unsafe memory access");
    }

    /**
     * The end of a call that read a mapping: throws here the unsafe-access error its loads
     * left pending, if any (JDK 21+: {@link #transition()}; before: {@link #roundTrip()}).
     * About 20 ns and 100 ns a call.
     */
    static void seal() {
        if (AT_TRANSITION) {
            transition();
        } else {
            roundTrip();
        }
    }

    /** A native call whose return to Java throws a pending unsafe-access error (JDK 21+); nothing else. */
    static void transition() {
        Runtime.getRuntime().maxMemory();
    }

    /** An outer length the compiler cannot fold (a volatile read): the array is never made inline. */
    private static volatile int one = 1;
    private static volatile long sink;

    /**
     * A call into the VM's runtime and back, which throws a pending unsafe-access error on
     * every JDK: {@code new byte[one][0]} with a length read from a volatile field is made by
     * the runtime in every mode (the interpreter's {@code multianewarray}, C1's
     * {@code Runtime1::new_multi_array}, C2's {@code OptoRuntime::multianewarray2_C}: C2
     * expands a multi-dimensional allocation inline only when its outer lengths are
     * constants), each a runtime entry whose return to Java checks asynchronous exceptions.
     */
    static void roundTrip() {
        sink += new byte[one][0].length;
    }
}
