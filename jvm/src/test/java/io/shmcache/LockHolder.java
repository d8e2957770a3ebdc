package io.shmcache;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * Holds the owner locks (docs/segment-format.md, section 13) of a golden control area's live
 * words, as the processes they name would, from a process of its own: a lock this JVM held
 * would be dropped by the kernel as soon as any channel of the file closed here (a POSIX
 * record lock is the process's), and a reader in this JVM would meet it as its own.
 *
 * <p>The child reads lines {@code PATH OFFSET...}: it drops the locks it held, takes those,
 * and answers {@code held}. {@link #start()} runs it; {@link #hold} asks it.
 */
final class LockHolder implements AutoCloseable {
    private final Process p;
    private final BufferedReader out;
    private final Writer in;

    private LockHolder(Process p) {
        this.p = p;
        this.out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
        this.in = new OutputStreamWriter(p.getOutputStream(), StandardCharsets.UTF_8);
    }

    static LockHolder start() throws IOException {
        List<String> cmd = new ArrayList<>(List.of(Child.JAVA, "-cp", System.getProperty("java.class.path"),
                LockHolder.class.getName()));
        return new LockHolder(new ProcessBuilder(cmd).redirectError(ProcessBuilder.Redirect.INHERIT).start());
    }

    /** Holds the locks of the words at these byte offsets of file (and no others). */
    void hold(Path file, Iterable<Long> offsets) throws IOException {
        StringBuilder line = new StringBuilder(file.toString());
        for (long off : offsets) {
            line.append(' ').append(off);
        }
        in.write(line + "\n");
        in.flush();
        if (!"held".equals(out.readLine())) {
            throw new IOException("the lock holder did not hold the locks of " + line);
        }
    }

    @Override
    public void close() throws InterruptedException {
        p.destroyForcibly();
        p.waitFor(60, TimeUnit.SECONDS);
    }

    public static void main(String[] args) throws IOException {
        BufferedReader lines = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        FileChannel ch = null;
        String line;
        while ((line = lines.readLine()) != null) {
            if (ch != null) {
                ch.close();
            }
            String[] f = line.split(" ");
            ch = FileChannel.open(Path.of(f[0]), StandardOpenOption.READ, StandardOpenOption.WRITE);
            for (int i = 1; i < f.length; i++) {
                if (ch.tryLock(Long.parseLong(f[i]), 8, false) == null) {
                    throw new IOException("the word at " + f[i] + " of " + f[0] + " is locked already");
                }
            }
            System.out.println("held");
            System.out.flush();
        }
    }
}
