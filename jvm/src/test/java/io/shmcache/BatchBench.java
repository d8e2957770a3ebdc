package io.shmcache;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * A micro-benchmark, no JMH (bench/README.md "JVM"): one thread looks the keys of a file
 * (raw keys, key_size bytes each, in lookup order) up in a cache, a row at a time
 * ({@link Call#get}), in chunks ({@link Call#getBatch}) of the sizes given and, for a
 * negative size, in chunks of its magnitude into one buffer ({@link Call#getPacked}), rounds
 * alternating the ways, and prints each way's rows/s per round and its median, by the wall
 * clock and by the thread's CPU time (the second is what a shared host's other load leaves
 * least changed: it counts only this thread's time on a core, misses included).
 *
 * <pre>java -cp target/test-classes:target/shmcache-jvm-VERSION.jar io.shmcache.BatchBench CACHE KEYS_FILE ROUNDS 256,-256</pre>
 *
 * It prints the path this JVM reads by ({@link Segment#access()}: the jar is multi-release,
 * so run it on the jar) and the value bytes every way read (each way must read the same).
 * bench/test_jvm_paths.py runs it on JDK 17 and 25, each path, process after process.
 */
public final class BatchBench {
    public static void main(String[] a) throws Exception {
        Segment seg = Segment.attach(a[0]);
        int ks = seg.keySize();
        byte[] raw = Files.readAllBytes(Path.of(a[1]));
        int n = raw.length / ks;
        byte[][] keys = new byte[n][];
        for (int i = 0; i < n; i++) {
            keys[i] = java.util.Arrays.copyOfRange(raw, i * ks, (i + 1) * ks);
        }
        int rounds = Integer.parseInt(a[2]);
        List<Integer> ways = new ArrayList<>();
        ways.add(0);
        for (String c : a[3].split(",")) {
            ways.add(Integer.parseInt(c));
        }
        double[][] rate = new double[ways.size()][rounds];
        double[][] cpuRate = new double[ways.size()][rounds];
        java.lang.management.ThreadMXBean tm = java.lang.management.ManagementFactory.getThreadMXBean();
        long expect = -1;
        for (int r = -1; r < rounds; r++) { // round -1: warm-up
            for (int w0 = 0; w0 < ways.size(); w0++) {
                int w = (w0 + Math.max(r, 0)) % ways.size();
                int chunk = ways.get(w);
                long t0 = System.nanoTime(), c0 = tm.getCurrentThreadCpuTime();
                long bytes = run(seg, keys, raw, chunk);
                double dt = (System.nanoTime() - t0) / 1e9, cpu = (tm.getCurrentThreadCpuTime() - c0) / 1e9;
                if (expect < 0) {
                    expect = bytes;
                } else if (bytes != expect) {
                    throw new AssertionError("way " + chunk + " read " + bytes + " bytes, not " + expect);
                }
                if (r >= 0) {
                    rate[w][r] = n / dt;
                    cpuRate[w][r] = n / cpu;
                }
            }
        }
        System.out.printf("%,d lookups, 1 thread, %d rounds (load average %.1f)%n", n, rounds,
                java.lang.management.ManagementFactory.getOperatingSystemMXBean().getSystemLoadAverage());
        System.out.printf("java %s, access %s, bytes %d%n", Runtime.version(), Segment.access(), expect);
        double row = median(rate[0]);
        for (int w = 0; w < ways.size(); w++) {
            double med = median(rate[w]);
            StringBuilder sb = new StringBuilder();
            for (double x : rate[w]) {
                sb.append(String.format(" %.2f", x / 1e6));
            }
            double cpuMed = median(cpuRate[w]);
            System.out.printf("  %-14s %6.2f M/s %6.0f ns/key %5.2fx row  runs%s | CPU %6.0f ns/key%n",
                    ways.get(w) == 0 ? "row at a time" : ways.get(w) > 0 ? "chunk " + ways.get(w) : "packed " + -ways.get(w), med / 1e6, 1e9 / med, med / row, sb, 1e9 / cpuMed);
        }
    }

    private static long run(Segment seg, byte[][] keys, byte[] raw, int chunk) {
        long bytes = 0;
        try (Call c = seg.call()) {
            if (chunk < 0) { // getPacked over the keys as they lie in the file, -chunk at a time
                int ks = seg.keySize(), m = -chunk;
                byte[] in = new byte[m * ks];
                Values out = new Values();
                for (int i = 0; i < keys.length; i += m) {
                    int n = Math.min(m, keys.length - i);
                    System.arraycopy(raw, i * ks, in, 0, n * ks);
                    c.getPacked(in, null, n, out);
                    for (int j = 0; j < n; j++) {
                        bytes += Math.max(0, out.length(j));
                    }
                }
            } else if (chunk == 0) {
                for (byte[] k : keys) {
                    byte[] v = c.get(k, 0, k.length);
                    bytes += v == null ? 0 : v.length;
                }
            } else {
                byte[][] in = new byte[chunk][], out = new byte[chunk][];
                for (int i = 0; i < keys.length; i += chunk) {
                    int n = Math.min(chunk, keys.length - i);
                    System.arraycopy(keys, i, in, 0, n);
                    c.getBatch(in, n, out);
                    for (int j = 0; j < n; j++) {
                        bytes += out[j] == null ? 0 : out[j].length;
                    }
                }
            }
        }
        return bytes;
    }

    private static double median(double[] x) {
        double[] s = x.clone();
        java.util.Arrays.sort(s);
        return s[s.length / 2];
    }
}
