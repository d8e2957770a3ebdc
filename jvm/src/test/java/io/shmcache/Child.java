package io.shmcache;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/**
 * The reader's command line (io.shmcache.cli.Main) in a JVM of its own, on this test's class
 * path: what an operator (or the conformance suite) runs, a process whose exit, stdout and
 * stderr the tests read.
 */
final class Child {
    private Child() {}

    static final String JAVA = Path.of(System.getProperty("java.home"), "bin", "java").toString();

    /**
     * This JVM's own {@code --} options (Unsafe's memory access denied, native access enabled:
     * the test leg's), so that a child runs as its parent does.
     */
    static final List<String> FLAGS = java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
            .stream().filter(a -> a.startsWith("--")).toList();

    /** A finished command: its exit status and its output. */
    record Result(int exit, String out, String err) {}

    /** The command line of {@code shmcache-jvm ARGS}, after {@code prefix} (setpriv ...). */
    static List<String> command(List<String> prefix, String... args) {
        List<String> cmd = new ArrayList<>(prefix);
        cmd.add(JAVA);
        cmd.addAll(FLAGS);
        cmd.addAll(List.of("-cp", System.getProperty("java.class.path"), "io.shmcache.cli.Main"));
        cmd.addAll(List.of(args));
        return cmd;
    }

    /** Runs {@code shmcache-jvm ARGS} to its end (at most 60 s). */
    static Result run(String... args) throws IOException, InterruptedException {
        return run(List.of(), args);
    }

    static Result run(List<String> prefix, String... args) throws IOException, InterruptedException {
        Process p = new ProcessBuilder(command(prefix, args)).start();
        CompletableFuture<String> err = async(() -> read(p.getErrorStream()));
        String out = read(p.getInputStream());
        if (!p.waitFor(60, TimeUnit.SECONDS)) {
            p.destroyForcibly().waitFor();
            throw new AssertionError("shmcache-jvm " + String.join(" ", args) + " did not end within 60 s");
        }
        return new Result(p.exitValue(), out, err.join());
    }

    /**
     * supplier's result, computed on a thread of its own: for work that blocks (a stream read
     * to its end, a wait), which must not queue behind other work in the common pool (one
     * thread on a 2-core host; on JDK 25 CompletableFuture's async methods use it even then).
     */
    static <T> CompletableFuture<T> async(java.util.function.Supplier<T> supplier) {
        CompletableFuture<T> f = new CompletableFuture<>();
        Thread t = new Thread(() -> {
            try {
                f.complete(supplier.get());
            } catch (Throwable e) {
                f.completeExceptionally(e);
            }
        }, "test-async");
        t.setDaemon(true);
        t.start();
        return f;
    }

    /** {@link #async} of work with no result. */
    static CompletableFuture<Void> asyncRun(Runnable work) {
        return async(() -> {
            work.run();
            return null;
        });
    }

    static String read(java.io.InputStream in) {
        try {
            return new String(in.readAllBytes(), StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new java.io.UncheckedIOException(e);
        }
    }
}
