package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.UncheckedIOException;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;
import java.util.zip.GZIPInputStream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Readiness (format section 14, docs/reader-contract.md's status table): the golden control
 * areas (golden/control/, made by the Python generator) give their expected ready,
 * caught_up, reason and why, and the same fields as the Python reader's status() of the same
 * file; a live Python writer (the real engine's ControlArea, this test's supervisor) walks a
 * cache through the states, and the Java status equals the Python reader's at each.
 * waitReady waits through a cache not there yet, and says why not at its timeout.
 */
class StatusTest {
    static final Path CONTROL = Goldens.DIR.resolve("control");
    static final Path PYTHON = Goldens.DIR.resolve("../.venv/bin/python").normalize();
    static final ObjectMapper JSON = new ObjectMapper();
    /** golden/contract.json's "status": the contract's fields, reasons and ages (docs/reader-contract.md). */
    static final JsonNode CONTRACT = contract();
    /** The ages, compared apart: as far apart as the two reads were. */
    static final List<String> AGES = strings(CONTRACT.get("ages"));
    /**
     * The fields compared equal between the readers: all of the contract's but the ages, the
     * name (each reader's own handle), assigned and workers (compared a row at a time) and why
     * (compared with its numbers of seconds apart).
     */
    static final List<String> FIELDS = strings(CONTRACT.get("fields")).stream()
            .filter(f -> !AGES.contains(f) && !List.of("name", "assigned", "workers", "why").contains(f)).toList();
    static final List<String> PARTITION_FIELDS = strings(CONTRACT.get("partition_fields"));

    private static JsonNode contract() {
        try {
            return JSON.readTree(Goldens.DIR.resolve("contract.json").toFile()).get("status");
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private static List<String> strings(JsonNode array) {
        List<String> out = new ArrayList<>();
        array.forEach(n -> out.add(n.asText()));
        return List.copyOf(out);
    }

    static Process supervisor, worker;
    static LockHolder holder; // holds the live words' owner locks (format section 13)
    final ShmFiles shm = new ShmFiles();

    @BeforeAll
    static void roles() throws IOException {
        supervisor = new ProcessBuilder("sleep", "600").start();
        worker = new ProcessBuilder("sleep", "600").start();
        holder = LockHolder.start();
    }

    @AfterAll
    static void stopRoles() throws InterruptedException {
        for (Process p : new Process[] {supervisor, worker}) {
            p.destroyForcibly();
            p.waitFor();
        }
        holder.close();
    }

    /** The byte offsets of the words whose owner locks a case's test holds ({@code locked}). */
    static List<Long> locked(JsonNode c) {
        List<Long> offs = new java.util.ArrayList<>();
        c.get("locked").forEach(o -> offs.add(o.asLong()));
        return offs;
    }

    @AfterEach
    void removeWhatWasMade() throws IOException {
        shm.removeAll();
    }

    static JsonNode cases() throws IOException {
        return JSON.readTree(CONTROL.resolve("expect.json").toFile()).get("cases");
    }

    static byte[] image(JsonNode c) throws IOException {
        return image(c, supervisor.pid(), worker.pid());
    }

    /**
     * A case's segment with its live owner words (the processes of the roles, by pid) and ages
     * filled (tests/lib/shmtest/golden_control.py image()).
     */
    static byte[] image(JsonNode c, long supervisorPid, long workerPid) throws IOException {
        byte[] data;
        try (InputStream in = new GZIPInputStream(Files.newInputStream(CONTROL.resolve(c.get("file").asText())))) {
            data = in.readAllBytes();
        }
        for (Iterator<Map.Entry<String, JsonNode>> it = c.get("live").fields(); it.hasNext();) {
            Map.Entry<String, JsonNode> e = it.next();
            long pid = e.getValue().asText().equals("supervisor") ? supervisorPid : workerPid;
            Goldens.putWord(data, Long.parseLong(e.getKey()), Liveness.ownerWord(pid));
        }
        long now = System.nanoTime(); // CLOCK_MONOTONIC, the cases' age clock
        for (Iterator<Map.Entry<String, JsonNode>> it = c.get("ages").fields(); it.hasNext();) {
            Map.Entry<String, JsonNode> e = it.next();
            Goldens.putWord(data, Long.parseLong(e.getKey()), now - (long) (e.getValue().asDouble() * 1e9));
        }
        long nowMs = System.currentTimeMillis(); // the times: Kafka timestamps, unix ms
        for (Iterator<Map.Entry<String, JsonNode>> it = c.path("times").fields(); it.hasNext();) {
            Map.Entry<String, JsonNode> e = it.next();
            Goldens.putWord(data, Long.parseLong(e.getKey()), nowMs - (long) (e.getValue().asDouble() * 1000));
        }
        return data;
    }

    static String whyPattern(JsonNode c) {
        return whyPattern(c.get("status").get("why").asText());
    }

    static String whyPattern(String why) {
        String text = why.replace("{supervisor_pid}", Long.toString(supervisor.pid()));
        return "^" + Pattern.quote(text).replace("{s}", "\\E\\d+\\Q") + "$";
    }

    /** golden_control.BEHIND_SLACK_S: how far past a golden's behind_s a reading may be. */
    static final double BEHIND_SLACK_S = 60;

    /** A case's behind_s (where it gives them) and the why of each of its readiness bounds. */
    static void assertBehindAndBounds(JsonNode c, Status st, String what) {
        JsonNode behind = c.get("status").path("behind_s");
        for (Status.Partition p : st.assigned()) {
            JsonNode w = behind.get(Integer.toString(p.partition()));
            if (w == null) {
                continue;
            }
            boolean ok = w.isNull() ? p.behindS() == null : p.behindS() != null && w.asDouble() <= p.behindS()
                    && p.behindS() <= w.asDouble() + BEHIND_SLACK_S;
            assertTrue(ok, what + ": partition " + p.partition() + ": behind_s " + p.behindS() + ", want " + w);
        }
        for (JsonNode b : c.path("bounds")) {
            Status.Bound bound = new Status.Bound(b.has("max_lag") ? b.get("max_lag").asLong() : null,
                    b.has("max_behind") ? b.get("max_behind").asDouble() : null);
            String said = st.beyond(bound);
            assertTrue(Pattern.matches(whyPattern(b.get("why").asText()), said), what + ": " + bound + ": " + said);
        }
    }

    /**
     * The one writer of control areas for the cross-language checks (tests/lib/shmtest/control_writer.py,
     * Go's status_test.go runs it too) on a cache of its own, started and past its "ready".
     */
    static Process controlWriter(String name) throws IOException {
        return new ProcessBuilder(PYTHON.toString(), "-P", "-m", "shmtest.control_writer", name)
                .redirectError(ProcessBuilder.Redirect.INHERIT).start();
    }

    /** The control writer's answer to one line (`status NAME`, `scenario S`): the Python reader's status(). */
    static JsonNode pythonSays(BufferedReader out, Writer in, String line) throws IOException {
        in.write(line + "\n");
        in.flush();
        String answer = out.readLine();
        assertNotNull(answer, "the Python control writer answered " + line);
        return JSON.readTree(answer);
    }

    /**
     * The contract's fields of two readers' status equal; ages as far apart as the two reads
     * were (apart seconds) and a little more, why's numbers of seconds as such.
     */
    static void assertSameStatus(JsonNode py, JsonNode java, double apart, String what) {
        for (String f : FIELDS) {
            assertEquals(py.get(f), java.get(f), what + ": " + f);
        }
        assertEquals(py.get("assigned").size(), java.get("assigned").size(), what + ": assigned");
        for (int i = 0; i < py.get("assigned").size(); i++) {
            for (String f : PARTITION_FIELDS) {
                JsonNode a = py.get("assigned").get(i).get(f), b = java.get("assigned").get(i).get(f);
                if (f.equals("worker_down") && a.isTextual() && b.isTextual()) { // "stale, no heartbeat for N s"
                    assertEquals(seconds(a.asText()), seconds(b.asText()), what + ": assigned[" + i + "]." + f);
                } else if (f.equals("behind_s") && a.isNumber() && b.isNumber()) { // an age, read apart
                    assertEquals(a.asDouble(), b.asDouble(), apart + 0.5, what + ": assigned[" + i + "]." + f);
                } else {
                    assertEquals(a, b, what + ": assigned[" + i + "]." + f);
                }
            }
        }
        for (String f : AGES) {
            JsonNode a = py.get(f), b = java.get(f);
            assertEquals(a.isNull(), b.isNull(), what + ": " + f);
            if (!a.isNull()) {
                assertEquals(a.asDouble(), b.asDouble(), apart + 0.5, what + ": " + f);
            }
        }
        assertEquals(seconds(py.get("why").asText()), seconds(java.get("why").asText()), what + ": why");
        assertSameWorkers(py.get("workers"), java.get("workers"), apart, what);
    }

    /** The worker rows of two readers' status: the same rows, fields and values, heartbeat ages apart seconds. */
    static void assertSameWorkers(JsonNode py, JsonNode java, double apart, String what) {
        assertNotNull(java, what + ": the Java status has no workers");
        assertEquals(py.size(), java.size(), what + ": worker rows");
        for (int i = 0; i < py.size(); i++) {
            JsonNode a = py.get(i), b = java.get(i);
            List<String> names = new ArrayList<>(), javaNames = new ArrayList<>();
            a.fieldNames().forEachRemaining(names::add);
            b.fieldNames().forEachRemaining(javaNames::add);
            assertEquals(new TreeSet<>(names), new TreeSet<>(javaNames), what + ": worker " + i);
            for (String f : names) {
                if (f.equals("heartbeat_age_s") && !a.get(f).isNull() && !b.get(f).isNull()) {
                    assertEquals(a.get(f).asDouble(), b.get(f).asDouble(), apart + 0.5, what + ": worker " + i + " " + f);
                } else if (a.get(f).isNumber() && b.get(f).isNumber()) {
                    assertEquals(a.get(f).asDouble(), b.get(f).asDouble(), what + ": worker " + i + " " + f);
                } else {
                    assertEquals(a.get(f), b.get(f), what + ": worker " + i + " " + f);
                }
            }
        }
    }

    private static String seconds(String why) {
        return why.replaceAll("\\d+ s\\b", "N s");
    }

    @Test
    void everyGoldenControlAreaGivesItsStatusAndThePythonReaders() throws Exception {
        Assumptions.assumeTrue(Files.isExecutable(PYTHON), "the Python reader (.venv) is not installed");
        JsonNode cases = cases();
        assertTrue(cases.size() >= 15, "the golden control areas are there");
        Process py = controlWriter(shm.name("python-reader"));
        try (BufferedReader out = new BufferedReader(new InputStreamReader(py.getInputStream(), StandardCharsets.UTF_8));
             Writer in = new OutputStreamWriter(py.getOutputStream(), StandardCharsets.UTF_8)) {
            assertEquals("ready", out.readLine(), "the Python control writer started");
            for (Iterator<Map.Entry<String, JsonNode>> it = cases.fields(); it.hasNext();) {
                Map.Entry<String, JsonNode> e = it.next();
                JsonNode c = e.getValue();
                String name = shm.name(e.getKey());
                Goldens.write(Path.of(Layout.SHM_DIR, name), image(c));
                holder.hold(Path.of(Layout.SHM_DIR, name), locked(c));
                Status st;
                long t0 = System.nanoTime();
                try (Segment r = Segment.attach(name)) {
                    st = r.status();
                }
                JsonNode want = c.get("status");
                assertEquals(want.get("ready").asBoolean(), st.ready(), e.getKey() + ": ready; why " + st.why());
                assertEquals(want.get("caught_up").asBoolean(), st.caughtUp(), e.getKey() + ": caught_up");
                assertEquals(want.get("reason").asText(), st.reason(), e.getKey() + ": reason; why " + st.why());
                assertTrue(Pattern.matches(whyPattern(c), st.why()), e.getKey() + ": why " + st.why());
                assertBehindAndBounds(c, st, e.getKey());
                JsonNode python = pythonSays(out, in, "status " + name);
                assertSameStatus(python, JSON.readTree(st.toJson()), (System.nanoTime() - t0) / 1e9, e.getKey());
            }
        } finally {
            py.getOutputStream().close();
            if (!py.waitFor(60, TimeUnit.SECONDS)) {
                py.destroyForcibly().waitFor();
            }
        }
    }

    /** The control writer's scenarios the live test walks a cache through, one a reason or more. */
    static final List<String> STEPS = List.of("ready", "lagging", "worker-stale", "lookup-error", "shared-group",
            "broker-waiting", "assigning", "stale-supervisor", "gap", "gap-accepted", "no-supervisor");

    @Test
    void aLivePythonWritersControlAreaReadsAsThePythonReaderReadsIt() throws Exception {
        Assumptions.assumeTrue(Files.isExecutable(PYTHON), "the Python writer (.venv) is not installed");
        String name = shm.name("live-writer");
        Process py = controlWriter(name);
        try (BufferedReader out = new BufferedReader(new InputStreamReader(py.getInputStream(), StandardCharsets.UTF_8));
             Writer in = new OutputStreamWriter(py.getOutputStream(), StandardCharsets.UTF_8)) {
            assertEquals("ready", out.readLine(), "the Python writer made its cache");
            List<String> reasons = new ArrayList<>();
            try (Segment r = Segment.attach(name)) {
                for (String step : STEPS) {
                    JsonNode python = pythonSays(out, in, "scenario " + step);
                    Status st = r.status();
                    assertSameStatus(python, JSON.readTree(st.toJson()), 1.0, step);
                    reasons.add(st.reason());
                }
            }
            assertEquals(List.of("ready", "lagging", "lagging", "lookup-error", "unassigned", "broker-waiting",
                    "assigning", "supervisor-stale", "gap", "ready", "no-supervisor"), reasons,
                    "the steps walk through the reasons");
        } finally {
            py.getOutputStream().close();
            if (!py.waitFor(60, TimeUnit.SECONDS)) {
                py.destroyForcibly().waitFor();
            }
        }
    }

    /**
     * waitReady with a bound: a ready cache 40 messages behind on partition 1 (control_ready_behind)
     * returns at once within maxLag 40; past maxLag 39 it gives up at its timeout naming the
     * partition, in the contract's words, with the status it judged.
     */
    @Test
    void waitReadyWithABoundSaysWhichPartitionsArePastIt() throws Exception {
        JsonNode c = cases().get("control_ready_behind");
        String name = shm.name("wait-bound");
        Path at = Path.of(Layout.SHM_DIR, name);
        Goldens.write(at, image(c));
        holder.hold(at, locked(c));
        try (Segment r = Segment.attach(name)) {
            assertTrue(r.waitReady(30, new Status.Bound(40L, null)).ready());
            ShmcacheException.NotReady e = assertThrows(ShmcacheException.NotReady.class,
                    () -> r.waitReady(0.2, new Status.Bound(39L, null)));
            assertTrue(e.getMessage().endsWith("not ready after 0.2 s: partitions more than 39 messages behind: "
                    + "1 (lag 40)"), e.getMessage());
            assertTrue(e.status().ready(), "the status judged was ready");
            e = assertThrows(ShmcacheException.NotReady.class, () -> r.waitReady(0.2, new Status.Bound(3L, 3600.0)));
            assertTrue(e.getMessage().endsWith(": partitions more than 3 messages behind: 1 (lag 40); partitions more "
                    + "than 3600.0 s behind: 2 (unknown)"), e.getMessage());
        }
    }

    @Test
    void waitReadyWaitsThroughACacheNotThereYetAndSaysWhyNotAtItsTimeout() throws Exception {
        JsonNode cases = cases();
        String name = shm.name("wait-ready");
        Path at = Path.of(Layout.SHM_DIR, name);
        try (Segment r = Segment.follow(name, null)) {
            CompletableFuture<Status> ready = Child.async(() -> r.waitReady(30));
            Thread.sleep(300); // the wait meets nothing at the name first (NotFound), and goes on
            assertFalse(ready.isDone(), "nothing at the name yet: still waiting");
            Path next = Path.of(Layout.SHM_DIR, name + ".next");
            Goldens.write(next, image(cases.get("control_ready")));
            holder.hold(next, locked(cases.get("control_ready")));
            Files.move(next, at, java.nio.file.StandardCopyOption.ATOMIC_MOVE);
            Status st = ready.get(30, TimeUnit.SECONDS);
            assertTrue(st.ready() && st.reason().equals("ready") && st.why().isEmpty(), st.toString());
        }
        Files.delete(at);
        Goldens.write(at, image(cases.get("control_lagging")));
        holder.hold(at, locked(cases.get("control_lagging")));
        try (Segment r = Segment.attach(name)) {
            long t0 = System.nanoTime();
            ShmcacheException.NotReady e = assertThrows(ShmcacheException.NotReady.class, () -> r.waitReady(0.3));
            assertTrue((System.nanoTime() - t0) / 1e9 >= 0.3, "waited its timeout");
            assertEquals("not-ready", e.kind());
            assertTrue(e.getMessage().contains("cache '" + name + "' not ready after 0.3 s: partitions not caught up: "
                    + "1 (lag 25)"), e.getMessage());
            assertEquals("lagging", e.status().reason());
        }
        Files.delete(at);
        try (Segment r = Segment.follow(name, null)) {
            ShmcacheException.NotReady e = assertThrows(ShmcacheException.NotReady.class, () -> r.waitReady(0.2));
            assertTrue(e.getMessage().contains("it does not exist (no " + at + ")"), e.getMessage());
        }
    }
}
