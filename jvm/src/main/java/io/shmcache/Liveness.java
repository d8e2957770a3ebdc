package io.shmcache;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.channels.OverlappingFileLockException;
import java.nio.charset.StandardCharsets;
import java.nio.file.AccessDeniedException;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * Owner words (docs/segment-format.md, section 13): {@code pid << 32 | stamp}, stamp = the
 * low 32 bits of the process's start time in 1/100 s since the epoch,
 * {@code round((starttime / CLK_TCK + btime) * 100)} (half to even, as Python rounds), 1 if 0.
 *
 * <p>A pid means something only in its own PID namespace. In a file whose owners hold owner
 * locks (a segment with H_OWNER_LOCKS set, a companion of version LOCKS_SINCE or later), the
 * owner of a word is alive while a write lock is held on the word's 8 bytes of the file: the
 * kernel drops it when its holder dies, in whatever namespace. A JVM cannot ask who holds a
 * lock without taking one: it takes a shared lock on the bytes and drops it at once ({@link
 * #locked}); taken means no owner.
 */
public final class Liveness {
    private Liveness() {}

    private static final double CLK_TCK = 100; // sysconf(_SC_CLK_TCK) on every Linux this runs on
    private static volatile double bootTime = -1;
    private static volatile long mine;

    private static double bootTime() {
        if (bootTime < 0) {
            double t = 0;
            try {
                for (String line : Files.readAllLines(Path.of("/proc/stat"), StandardCharsets.US_ASCII)) {
                    if (line.startsWith("btime ")) {
                        t = Double.parseDouble(line.substring(6).trim());
                    }
                }
            } catch (IOException | NumberFormatException e) {
                t = 0;
            }
            bootTime = t;
        }
        return bootTime;
    }

    /** {state letter, start time in clock ticks}, or null when there is no such process. */
    private static long[] procStat(long pid) throws IOException {
        String raw;
        try {
            raw = Files.readString(Path.of("/proc/" + pid + "/stat"), StandardCharsets.ISO_8859_1);
        } catch (java.nio.file.NoSuchFileException e) {
            return null;
        }
        int i = raw.lastIndexOf(')');
        if (i < 0) {
            return null;
        }
        String[] f = raw.substring(i + 1).trim().split("\\s+"); // f[0] is field 3 (state); starttime is field 22
        if (f.length < 20) {
            return null;
        }
        try {
            return new long[] {f[0].charAt(0), Long.parseUnsignedLong(f[19])};
        } catch (NumberFormatException e) {
            return null;
        }
    }

    private static long stampOf(long start) {
        double t = start / CLK_TCK + bootTime();
        long s = ((long) Math.rint(t * 100)) & 0xFFFFFFFFL;
        return s == 0 ? 1 : s;
    }

    /** The owner word of process pid, 0 if it cannot be read. */
    public static long ownerWord(long pid) {
        try {
            long[] st = procStat(pid);
            return st == null ? 0 : pid << 32 | stampOf(st[1]);
        } catch (IOException e) {
            return 0;
        }
    }

    /** This process's owner word. */
    public static long mine() {
        if (mine == 0) {
            mine = ownerWord(ProcessHandle.current().pid());
        }
        return mine;
    }

    /**
     * Whether the process an owner word names runs: not gone, not a zombie, not another
     * process with its pid. One this process may not look at counts as alive.
     */
    public static boolean isAlive(long w) {
        long pid = w >> 32;
        if (pid <= 0) {
            return false;
        }
        try {
            long[] st = procStat(pid);
            return st != null && st[0] != 'Z' && stampOf(st[1]) == (w & 0xFFFFFFFFL);
        } catch (AccessDeniedException e) {
            return true;
        } catch (IOException e) {
            return false; // gone while we read it
        }
    }

    /**
     * Whether a write lock (an owner lock) is held on word {@code index} of the file {@code ch}
     * holds open: a shared lock on its bytes cannot be taken. Another thread's passing test
     * of the same bytes is waited out; one held by this JVM itself counts as held. A channel
     * that cannot say (closed) falls back to nothing held.
     */
    static boolean locked(FileChannel ch, long index) {
        for (int i = 0; ; i++) {
            try {
                FileLock l = ch.tryLock(index * 8, 8, true);
                if (l == null) {
                    return true;
                }
                l.release();
                return false;
            } catch (OverlappingFileLockException e) {
                if (i >= 10_000) {
                    return true; // held by this JVM: its own row's lock
                }
                Thread.onSpinWait();
            } catch (IOException e) {
                return false;
            }
        }
    }

    /**
     * Whether the process owner word {@code w}, published at word {@code index} of the file
     * {@code ch} holds open, runs: by its owner lock when {@code locks}, else by the pid rule.
     * This process's own word is alive.
     */
    static boolean isAlive(long w, FileChannel ch, long index, boolean locks) {
        if (w == 0) {
            return false;
        }
        if (!locks) {
            return isAlive(w);
        }
        return w == mine() || locked(ch, index);
    }
}
