package io.shmcache;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;

/** FIFOs at a cache's name, for the tests of an open that must never block (format section 1). */
final class Fifos {
    private Fifos() {}

    /** A FIFO at p (mkfifo). */
    static void make(Path p) throws IOException, InterruptedException {
        run("mkfifo", "-m", "0600", p.toString());
    }

    /**
     * Lets every open blocked on the FIFO at p return: a writer opens it and closes it again
     * (a shell's redirection, given up after 2 s when no reader is blocked on it).
     */
    static void release(Path p) throws IOException, InterruptedException {
        new ProcessBuilder("timeout", "2", "sh", "-c", ": > \"$1\"", "sh", p.toString()).start().waitFor(10,
                TimeUnit.SECONDS);
    }

    private static void run(String... cmd) throws IOException, InterruptedException {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        if (!p.waitFor(30, TimeUnit.SECONDS) || p.exitValue() != 0) {
            throw new IOException(String.join(" ", cmd) + " failed: " + out);
        }
    }

    /**
     * A process that swaps what is at a and at b (renameat2 RENAME_EXCHANGE, one system call:
     * each name always holds one of the two files) in a loop until it is stopped, started once
     * it has made its first swap. The caller stops it by pid ({@link Process#destroy()}).
     */
    static Process exchanger(Path a, Path b) throws IOException {
        String script = String.join("\n",
                "import ctypes, os, sys",
                "libc = ctypes.CDLL(None, use_errno=True)",
                "AT_FDCWD, RENAME_EXCHANGE = -100, 2",
                "a, b = (os.fsencode(p) for p in sys.argv[1:3])",
                "first = True",
                "while True:",
                "    if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:",
                "        raise OSError(ctypes.get_errno(), 'renameat2')",
                "    if first:",
                "        print('swapping', flush=True)",
                "        first = False");
        Process p = new ProcessBuilder("python3", "-c", script, a.toString(), b.toString())
                .redirectError(ProcessBuilder.Redirect.INHERIT).start();
        String line = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8)).readLine();
        if (!"swapping".equals(line)) {
            p.destroyForcibly();
            throw new IOException("the exchanger did not start: " + line);
        }
        return p;
    }
}
