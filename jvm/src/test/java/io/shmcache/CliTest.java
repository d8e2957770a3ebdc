package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.RandomAccessFile;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.HexFormat;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The command line of docs/reader-contract.md ({@code shmcache-jvm}), in processes of its
 * own: get's lines and exit statuses, one stderr line {@code shmcache-jvm: KIND: message}
 * with the contract's KIND for each case, watch following a name through what an operator
 * (or a hostile neighbour) does to it and living on, stats' and status' JSON fields,
 * wait-ready's answers.
 */
class CliTest {
    static final Goldens.Case BASE = Goldens.cases().get("base");
    static final HexFormat HEX = HexFormat.of();
    static final ObjectMapper JSON = new ObjectMapper();
    static final Pattern ERROR = Pattern.compile("shmcache-jvm: [a-z-]+: .+\n");

    final ShmFiles shm = new ShmFiles();

    @AfterEach
    void removeWhatWasMade() throws IOException {
        shm.removeAll();
    }

    static String hex(byte[] b) {
        return HEX.formatHex(b);
    }

    /** An error as the contract words it: one stderr line of this KIND, exit 2, nothing on stdout. */
    static void assertError(Child.Result r, String kind) {
        assertEquals(2, r.exit(), r.toString());
        assertTrue(ERROR.matcher(r.err()).matches() && r.err().startsWith("shmcache-jvm: " + kind + ": "), r.err());
        assertEquals("", r.out());
    }

    /** --help, -h and help, alone or after a command, print every command's usage and exit 0; after -- it is a name. */
    @Test
    void helpPrintsTheUsageAndExitsZero() throws Exception {
        for (String[] args : List.of(new String[] {"--help"}, new String[] {"-h"}, new String[] {"help"},
                new String[] {"get", "--help"}, new String[] {"status", "-h", "x"})) {
            Child.Result r = Child.run(args);
            assertEquals(0, r.exit(), r.toString());
            assertEquals("", r.err());
            assertTrue(r.out().startsWith("usage: java -jar shmcache-jvm"), r.out());
            for (String command : List.of("get", "watch", "stats", "status", "wait-ready")) {
                assertTrue(r.out().contains("\n  " + command + " "), command + " in " + r.out());
            }
        }
        assertError(Child.run("get", "--", "--help"), "bad-argument");
    }

    @Test
    void getPrintsALineAKeyAndExitsZeroOneOrTwo() throws Exception {
        String name = shm.name("get");
        Goldens.write(Path.of(Layout.SHM_DIR, name), Goldens.bytes(BASE));
        List<Goldens.Key> keys = BASE.keys();
        Goldens.Key hit = keys.stream().filter(k -> k.value() != null && k.value().length > 0).findFirst().orElseThrow();
        Goldens.Key miss = keys.stream().filter(k -> k.value() == null && !k.corrupt()).findFirst().orElseThrow();
        Child.Result r = Child.run("get", name, hex(hit.key()), hex(hit.key()).toUpperCase());
        assertEquals(0, r.exit(), r.toString());
        assertEquals(hex(hit.value()) + "\n" + hex(hit.value()) + "\n", r.out());
        r = Child.run("get", name, hex(hit.key()), hex(miss.key()));
        assertEquals(1, r.exit(), r.toString());
        assertEquals(hex(hit.value()) + "\n-\n", r.out());
        keys.stream().filter(k -> k.value() != null && k.value().length == 0).findFirst().ifPresent(empty -> {
            try {
                Child.Result e = Child.run("get", name, hex(empty.key()));
                assertEquals(0, e.exit(), e.toString());
                assertEquals("\n", e.out(), "an empty value is an empty line");
            } catch (IOException | InterruptedException x) {
                throw new AssertionError(x);
            }
        });
        assertError(Child.run("get", name, "zz"), "bad-argument");
        assertError(Child.run("get", name, "00"), "bad-argument"); // not the cache's key size
        assertError(Child.run("get", "../x", hex(hit.key())), "bad-argument");
        assertError(Child.run("get", "--owner", "no-such-user-shmcache-45", name, hex(hit.key())), "bad-argument");
        assertError(Child.run("get", name), "bad-argument");
        assertError(Child.run("get", "--frobnicate", name, hex(hit.key())), "bad-argument");
        assertError(Child.run("get", name + "-none", hex(hit.key())), "not-found");
        // --decode txmeta: each value found as its decode (TxMetaTest holds the objects to the golden ones)
        r = Child.run("get", "--decode", "txmeta", name, hex(hit.key()), hex(miss.key()));
        assertEquals(1, r.exit(), r.toString());
        assertEquals(TxMetaValue.json(TxMetaValue.parse(hit.value())) + "\n-\n", r.out());
        assertEquals("", r.err());
        assertError(Child.run("get", "--decode", "hex", name, hex(hit.key())), "bad-argument");
        assertError(Child.run("get", "--decode", name, hex(hit.key())), "bad-argument"); // the name taken as the format
        assertError(Child.run("watch", "--decode", "txmeta", name, hex(hit.key()), "1"), "bad-argument");
    }

    @Test
    void eachRefusalIsItsKind() throws Exception {
        String key = hex(BASE.keys().get(1).key());
        Path junk = Path.of(Layout.SHM_DIR, shm.name("junk"));
        byte[] noise = new byte[1 << 16];
        new Random(1).nextBytes(noise);
        Goldens.write(junk, noise);
        assertError(Child.run("get", junk.getFileName().toString(), key), "not-a-cache");
        for (Goldens.Case c : Goldens.cases().values()) {
            if (c.attachError() == null) {
                continue;
            }
            Path p = Path.of(Layout.SHM_DIR, shm.name(c.name()));
            Goldens.write(p, Goldens.bytes(c));
            String kind = switch (c.attachError()) {
                case "not_a_cache" -> "not-a-cache";
                case "version" -> "unknown-version";
                default -> "corrupt";
            };
            assertError(Child.run("status", p.getFileName().toString()), kind);
        }
        Path open = Path.of(Layout.SHM_DIR, shm.name("open"));
        Goldens.write(open, Goldens.bytes(BASE));
        Files.setPosixFilePermissions(open, java.nio.file.attribute.PosixFilePermissions.fromString("rw-rw-rw-"));
        assertError(Child.run("get", open.getFileName().toString(), key), "unsafe-mode");
        if (((Number) Files.getAttribute(open, "unix:uid")).intValue() == 0) { // another user's file, owner named
            Path theirs = Path.of(Layout.SHM_DIR, shm.name("theirs"));
            Goldens.write(theirs, Goldens.bytes(BASE));
            Files.setAttribute(theirs, "unix:uid", 12345);
            assertError(Child.run("get", "--owner", "root", theirs.getFileName().toString(), key), "wrong-owner");
            Child.Result any = Child.run("get", theirs.getFileName().toString(), key);
            assertEquals(0, any.exit(), "no owner named: read");
        }
    }

    /** Lines of a running process's stdout, as they come. */
    static LinkedBlockingQueue<String> lines(Process p) {
        LinkedBlockingQueue<String> q = new LinkedBlockingQueue<>();
        Child.asyncRun(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
                for (String l; (l = in.readLine()) != null;) {
                    q.add(l);
                }
            } catch (IOException e) {
                // the process ended
            }
        });
        return q;
    }

    /** The next line of a watch: ELAPSED (three decimals) and the outcome, which must start with {@code want}. */
    static String next(LinkedBlockingQueue<String> q, String want) throws InterruptedException {
        String l = q.poll(30, TimeUnit.SECONDS);
        assertNotNull(l, "no line for " + want);
        assertTrue(l.matches("\\d+\\.\\d{3} .*"), l);
        String outcome = l.substring(l.indexOf(' ') + 1);
        assertTrue(outcome.startsWith(want), "expected '" + want + "...', got: " + l);
        return outcome;
    }

    static void putAt(Path at, byte[] data) throws IOException {
        Path next = Path.of(at + ".next");
        Goldens.write(next, data);
        Files.move(next, at, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    }

    @Test
    void watchFollowsTheNameThroughEverythingAndLivesOn() throws Exception {
        String name = shm.name("watch");
        Path at = Path.of(Layout.SHM_DIR, name);
        Goldens.Case other = Goldens.cases().get("record_hash_changed");
        byte[] key = FollowTest.gone(other).key(); // a hit of the base golden, a miss of the other
        Goldens.Key hit = BASE.keys().stream().filter(k -> java.util.Arrays.equals(k.key(), key)).findFirst()
                .orElseThrow();
        Process p = new ProcessBuilder(Child.command(List.of(), "watch", name, hex(hit.key()), "120")).start();
        CompletableFuture<String> err = Child.async(() -> Child.read(p.getErrorStream()));
        try {
            LinkedBlockingQueue<String> q = lines(p);
            assertTrue(next(q, "error not-found: ").contains(at.toString()), "nothing at the name yet");
            putAt(at, Goldens.bytes(BASE));
            assertEquals("hit " + hex(hit.value()), next(q, "hit "));
            try (RandomAccessFile f = new RandomAccessFile(at.toFile(), "rw")) {
                f.setLength(Layout.PAGE); // cut short under the watch's mapping
            }
            assertTrue(next(q, "error corrupt: ").contains("cut short"));
            Files.delete(at);
            next(q, "error not-found: ");
            byte[] noise = new byte[1 << 20];
            new Random(2).nextBytes(noise);
            putAt(at, noise);
            next(q, "error not-a-cache: ");
            Files.delete(at);
            next(q, "error not-found: ");
            Fifos.make(at);
            assertTrue(next(q, "error not-a-cache: ").contains("a FIFO"), "no hang on a FIFO");
            putAt(at, Goldens.bytes(other)); // renamed over the FIFO
            assertEquals("miss", next(q, "miss"), "the new cache answers");
            putAt(at, Goldens.bytes(BASE));
            assertEquals("hit " + hex(hit.value()), next(q, "hit "));
            assertTrue(p.isAlive(), "the watch lives on");
        } finally {
            p.destroy();
            p.waitFor(30, TimeUnit.SECONDS);
        }
        assertFalse(err.get(30, TimeUnit.SECONDS).contains("Exception"), "nothing thrown on stderr: " + err.get());
        Child.Result r = Child.run("watch", name, hex(hit.key()), "2");
        assertEquals(0, r.exit(), "a watch ends when its time is up: " + r);
        assertTrue(r.out().lines().allMatch(l -> l.endsWith(" hit " + hex(hit.value()))) && r.out().lines().count() <= 1,
                "one outcome, one line at most (none if the JVM took the 2 s to start): " + r.out());
        assertError(Child.run("watch", name, hex(hit.key()), "soon"), "bad-argument");
    }

    @Test
    void statsAndStatusPrintTheContractsJsonAndWaitReadyItsAnswers() throws Exception {
        String name = shm.name("json");
        byte[] data = Goldens.bytes(BASE);
        Goldens.write(Path.of(Layout.SHM_DIR, name), data);
        Child.Result r = Child.run("stats", "--json", name);
        assertEquals(0, r.exit(), r.toString());
        JsonNode st = JSON.readTree(r.out());
        for (String f : List.of("name", "entries", "bytes_used", "capacity_bytes", "max_entries", "memory", "evictions",
                "lock_takeovers", "sets", "deletes", "writers", "reader_hits", "reader_misses", "reader_batches",
                "readers", "corruptions", "key_size", "max_value", "buckets", "layout_version", "creation_id",
                "created_s")) {
            assertTrue(st.has(f), "stats has " + f + ": " + r.out());
        }
        assertEquals(BASE.entries(), st.get("entries").asLong());
        assertEquals(Goldens.word(data, Layout.H_CREATION_ID * Layout.WORD), st.get("creation_id").asLong());
        r = Child.run("status", name); // JSON with or without --json
        assertEquals(0, r.exit(), r.toString());
        JsonNode status = JSON.readTree(r.out());
        for (String f : List.of("name", "topic", "partitions", "supervisor_pid", "supervisor_alive", "supervisor_stale",
                "supervisor_heartbeat_age_s", "broker", "broker_waiting_s", "lookup_error", "lookup_failing_s",
                "assigning", "assigned", "unassigned", "elsewhere", "shared_group", "group_members", "group_others",
                "gap_partitions", "gap_offsets", "gaps_accepted", "caught_up", "ready", "reason", "why")) {
            assertTrue(status.has(f), "status has " + f + ": " + r.out());
        }
        assertEquals("no-supervisor", status.get("reason").asText());
        r = Child.run("wait-ready", "--timeout", "0.2", name);
        assertEquals(1, r.exit(), r.toString());
        assertEquals("shmcache-jvm: not-ready: cache '" + name + "' not ready after 0.2 s: no live supervisor\n", r.err());
        assertError(Child.run("wait-ready", "--timeout", "-1", name), "bad-argument");
        // a ready cache created while wait-ready waits: it waits through nothing at the name
        String later = shm.name("json-later");
        Process sup = new ProcessBuilder("sleep", "600").start(), work = new ProcessBuilder("sleep", "600").start();
        try (LockHolder holder = LockHolder.start()) {
            Process w = new ProcessBuilder(Child.command(List.of(), "wait-ready", "--timeout", "60", later)).start();
            CompletableFuture<String> out = Child.async(() -> Child.read(w.getInputStream()));
            Thread.sleep(500);
            assertTrue(w.isAlive(), "still waiting while nothing is at the name");
            JsonNode ready = StatusTest.cases().get("control_ready");
            byte[] img = StatusTest.image(ready, sup.pid(), work.pid());
            Path staged = Path.of(Layout.SHM_DIR, later + ".next");
            Goldens.write(staged, img);
            holder.hold(staged, StatusTest.locked(ready)); // as its live owners would (format section 13)
            Files.move(staged, Path.of(Layout.SHM_DIR, later), StandardCopyOption.ATOMIC_MOVE);
            assertTrue(w.waitFor(60, TimeUnit.SECONDS), "wait-ready did not see the ready cache");
            assertEquals(0, w.exitValue());
            JsonNode got = JSON.readTree(out.get(30, TimeUnit.SECONDS));
            assertTrue(got.get("ready").asBoolean() && got.get("reason").asText().equals("ready"), got.toString());
        } finally {
            sup.destroyForcibly().waitFor();
            work.destroyForcibly().waitFor();
        }
    }
}
