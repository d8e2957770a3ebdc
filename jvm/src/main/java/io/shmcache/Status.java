package io.shmcache;

import static io.shmcache.Layout.*;

import java.math.BigDecimal;
import java.math.RoundingMode;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.stream.Collectors;

/**
 * Readiness and progress of a cache, from its control area alone (docs/segment-format.md
 * section 14): the fields of docs/reader-contract.md's status table, by the rule every
 * reader follows, with the same {@code reason} and {@code why} as the Python reader
 * (engine/control/status.py) and the Go reader. Ready means every partition of the topic
 * assigned here by the supervisor alive now and applied up to its target.
 *
 * <p>The control area is untrusted and live: every word is read as it stands, a word out of
 * its range reads as nothing, and the multi-word reads (the group, a failing look-up) are
 * made between two looks at their version word and retried when torn. The names of the
 * record components are the JSON fields' in camel case ({@link #toJson()} writes them in
 * snake case).
 *
 * @param name the cache
 * @param topic the topic's name
 * @param partitions the topic's partition count (0: not seen yet)
 * @param supervisorPid the supervisor's pid, null if none
 * @param supervisorAlive whether the supervisor's process is alive
 * @param supervisorHeartbeatAgeS seconds since the live supervisor last went round its loop (null: none)
 * @param supervisorStale that age is over control_status.STALE_HEARTBEAT_S
 * @param assigned the partitions assigned here
 * @param unassigned partitions of the topic not assigned here
 * @param elsewhere of those, the ones another member of the group holds
 * @param groupMembers members of the consumer group as the supervisor last saw it (null: unknown)
 * @param groupOthers the other members, each with the partitions it holds
 * @param sharedGroup whether the group has other members
 * @param caughtUp every partition assigned here by the live supervisor and caught up, settled, the broker answering
 * @param ready caught up, and no retention gap unless the live supervisor accepts them
 * @param gapsAccepted the live supervisor serves a table with retention gaps as ready
 * @param assigning an assignment is being published (not settled)
 * @param broker "connecting", "up" or "waiting for the broker"; null without a live supervisor
 * @param brokerWaitingS seconds the supervisor has waited for the broker (null: not waiting)
 * @param lookupError a failing look-up of where partitions start ("" none)
 * @param lookupFailingS for how long it has failed (null: none)
 * @param gapPartitions partitions with a retention gap
 * @param gapOffsets offsets retention deleted before this table had them, summed
 * @param reason "ready", or why not in one word (format section 14's table)
 * @param why "" when ready, else the sentence of that table
 * @param workers the worker rows in use, in row order (format section 14, "The workers")
 */
public record Status(String name, String topic, int partitions, Long supervisorPid, boolean supervisorAlive,
                     Double supervisorHeartbeatAgeS, boolean supervisorStale, List<Partition> assigned,
                     List<Integer> unassigned, List<Integer> elsewhere, Long groupMembers, List<Member> groupOthers,
                     boolean sharedGroup, boolean caughtUp, boolean ready, boolean gapsAccepted, boolean assigning,
                     String broker, Double brokerWaitingS, String lookupError, Double lookupFailingS,
                     List<Integer> gapPartitions, long gapOffsets, String reason, String why,
                     List<Worker> workers) {

    /**
     * A partition assigned here.
     *
     * @param partition its number
     * @param worker the index of the worker that owns it (null: none, or a word out of range)
     * @param applied the next offset to apply
     * @param highWatermark the readiness target (-1 unknown)
     * @param latest the newest high watermark seen (never below applied)
     * @param lag latest - applied (null: unknown)
     * @param behindS seconds since the last message applied was produced, 0 without lag (null: unknown)
     * @param caughtUp applied up to the target, its worker up and beating
     * @param workerDown why its worker applies nothing now (null: it is up and beating)
     * @param gap retention deleted offsets of it before this table had them
     */
    public record Partition(int partition, Integer worker, long applied, long highWatermark, long latest, Long lag,
                            Double behindS, boolean caughtUp, String workerDown, boolean gap) {}

    /**
     * A worker row in use: the supervisor's worker process, its state, and what it applied
     * since its slot was first started (the figures of the supervisor's `shmcache status`).
     *
     * @param worker its row's index
     * @param pid its process's pid (null: the row has no owner yet)
     * @param alive whether that process is alive
     * @param state a WORKER_STATES word, as format section 14 judges it
     * @param restartFailures its deaths in a row (the supervisor's backoff; 0 without a live supervisor)
     * @param nextRestartS backing off: when its restart is due, in unix seconds (else null)
     * @param heartbeatAgeS seconds since its last loop (null: none yet)
     * @param stale up, its heartbeat older than the live supervisor's bound
     * @param waitingForBucket the bucket whose lock, held by another live process, its write waits for (null: none)
     * @param starts starts of its slot
     * @param adds ADD entries applied
     * @param deletes DELETE entries applied
     * @param messages Kafka messages applied
     * @param malformed malformed messages (the entries the format keeps of each applied)
     * @param unknownActions entries of an unknown action, skipped
     */
    public record Worker(int worker, Long pid, boolean alive, String state, long restartFailures, Double nextRestartS,
                         Double heartbeatAgeS, boolean stale, Long waitingForBucket, long starts, long adds,
                         long deletes, long messages, long malformed, long unknownActions) {}

    /** Another member of the consumer group, and the partitions of the topic it holds. */
    public record Member(String clientId, String host, String instanceId, List<Integer> partitions) {}

    /**
     * How far behind its topic a ready cache may be, partition by partition (format section
     * 14, "The readiness bound"): readiness alone is a latch, right for "the cache holds the
     * whole topic"; a bound also asks "and is no more than this behind it".
     *
     * @param maxLag no partition more than this many messages behind (a lag not known is more); null: no bound
     * @param maxBehindS no partition more than this many seconds behind, measured from when the
     *     last message it applied was produced (behind_s; one not known is more); null: no bound
     */
    public record Bound(Long maxLag, Double maxBehindS) {
        /** No bound: ready is enough. */
        public static final Bound NONE = new Bound(null, null);
    }

    /**
     * Which partitions assigned here are further behind the topic than the bound, in the words
     * every reader uses ("" when none is, or the bound has no limit). It judges a ready status;
     * {@link #why()} says why one is not ready.
     */
    public String beyond(Bound bound) {
        List<String> said = new ArrayList<>();
        if (bound.maxLag() != null) {
            List<String> over = new ArrayList<>();
            for (Partition p : assigned) {
                if (p.lag == null || p.lag > bound.maxLag()) {
                    over.add(p.partition + " (lag " + (p.lag == null ? "unknown" : p.lag.toString()) + ")");
                }
            }
            if (!over.isEmpty()) {
                said.add("partitions more than " + bound.maxLag() + " messages behind: "
                        + String.join(", ", over.subList(0, Math.min(20, over.size()))));
            }
        }
        if (bound.maxBehindS() != null) {
            List<String> over = new ArrayList<>();
            for (Partition p : assigned) {
                if (p.behindS == null || p.behindS > bound.maxBehindS()) {
                    over.add(p.partition + " (" + (p.behindS == null ? "unknown" : fixed(p.behindS, 0) + " s") + ")");
                }
            }
            if (!over.isEmpty()) {
                said.add("partitions more than " + fixed(bound.maxBehindS(), 1) + " s behind: "
                        + String.join(", ", over.subList(0, Math.min(20, over.size()))));
            }
        }
        return String.join("; ", said);
    }

    /** This status as the contract's JSON object (snake-case field names). */
    public String toJson() {
        return Json.write(this);
    }

    private Status withReason(String reason, String why) {
        return new Status(name, topic, partitions, supervisorPid, supervisorAlive, supervisorHeartbeatAgeS,
                supervisorStale, assigned, unassigned, elsewhere, groupMembers, groupOthers, sharedGroup, caughtUp, ready,
                gapsAccepted, assigning, broker, brokerWaitingS, lookupError, lookupFailingS, gapPartitions, gapOffsets,
                reason, why, workers);
    }

    private static final String WAITING = "waiting for the broker";
    private static final int TRIES = 5; // reads of a multi-word field torn by its writer, before it reads as none

    /** The status of the cache mapped by m (reads its control area as it stands now). */
    static Status read(String name, Mapped m) {
        return new Reading(m).status(name);
    }

    /** One reading of a control area (the clock read once, as each age is). */
    private static final class Reading {
        final Mapped m;
        final long ageNow; // now on the clock H_AGE_CLOCK names

        Reading(Mapped m) {
            this.m = m;
            this.ageNow = m.header(H_AGE_CLOCK) == AGE_CLOCK_MONOTONIC ? System.nanoTime() : wallNanos();
        }

        long h(int word) {
            return m.header(word);
        }

        /** Seconds since the time in header word w, never below 0; null if it holds no time. */
        Double age(int w) {
            long t = h(w);
            return t > 0 ? Math.max(0.0, (double) (ageNow - t) / 1e9) : null;
        }

        byte[] bytes(long pos, int n) {
            byte[] out = new byte[n];
            m.map.copy(pos, out, 0, n);
            return out;
        }

        long row(long off, long i, int k) {
            return m.map.getLong(off + (i * ROW_WORDS + k) * WORD);
        }

        Status status(String name) {
            long nRaw = h(H_PARTITIONS);
            int n = nRaw < 0 || nRaw > MAX_PARTITIONS ? 0 : (int) nRaw;
            long tlen = h(H_TOPIC_LEN); // out of 0..TOPIC_MAX: no topic
            String topic = tlen < 0 || tlen > TOPIC_MAX ? "" : new String(bytes(H_TOPIC * WORD, (int) tlen),
                    StandardCharsets.UTF_8);
            long sup = h(H_SUPERVISOR);
            // an assignment is published row by row: the rows are read between two looks at
            // the rebalance count and the assigning flag, and nothing is ready across a change
            long rebalances = h(H_REBALANCES), assigningWord = h(H_ASSIGNING);
            List<Integer> gapParts = new ArrayList<>();
            boolean[] gapped = new boolean[n];
            for (int p = 0; p < n; p++) {
                if ((h(H_GAP_BITS + p / 64) >>> (p % 64) & 1) != 0) {
                    gapParts.add(p);
                    gapped[p] = true;
                }
            }
            boolean supAlive = m.alive(sup, H_SUPERVISOR);
            // the applied times, kept by the supervisor H_PARTITION_TIMES names: trusted only while it is the cache's
            boolean timed = sup != 0 && h(H_PARTITION_TIMES) == sup;
            long nowMs = System.currentTimeMillis();
            List<long[]> rows = partitionRows(n);
            Map<Integer, Worker> workers = workers(supAlive);
            List<Partition> parts = new ArrayList<>();
            Set<Integer> here = new TreeSet<>();
            for (long[] r : rows) {
                int p = (int) r[0];
                long owner = r[1 + P_OWNER] - 1;
                if (owner < -1 || owner >= MAX_WORKERS) {
                    owner = -1;
                }
                Integer worker = owner >= 0 ? (int) owner : null;
                long applied = r[1 + P_APPLIED], hw = r[1 + P_HIGH_WATERMARK];
                long latest = Math.max(Math.max(r[1 + P_LATEST], hw), applied);
                Long lag = latest >= 0 ? Math.max(0, latest - Math.max(applied, 0)) : null;
                long t = timed ? r[1 + P_APPLIED_TIME] : 0;
                Double behind = lag == null ? null : lag == 0 ? Double.valueOf(0.0)
                        : t > 0 ? Double.valueOf(Math.max(0.0, (nowMs - t) / 1e3)) : null;
                String down = workerDown(workers.get(worker == null ? -1 : worker));
                parts.add(new Partition(p, worker, applied, hw, latest, lag, behind,
                        r[1 + P_CAUGHT_UP] != 0 && down == null, down, gapped[p]));
                here.add(p);
            }
            List<Integer> unassigned = new ArrayList<>();
            for (int p = 0; p < n; p++) {
                if (!here.contains(p)) {
                    unassigned.add(p);
                }
            }
            Group g = supAlive ? group(n) : Group.NONE;
            boolean settled = assigningWord == 0 && h(H_ASSIGNING) == 0 && h(H_REBALANCES) == rebalances;
            Double beat = supAlive ? age(H_SUPERVISOR_HEARTBEAT) : null;
            boolean whole = n > 0 && here.size() == n;
            String broker = null;
            Double waiting = null;
            if (supAlive) {
                long state = h(H_BROKER_STATE), since = h(H_BROKER_SINCE);
                broker = state == BROKER_UP ? "up" : state == BROKER_WAITING ? WAITING : "connecting";
                if (state == BROKER_WAITING) {
                    waiting = since > 0 ? Math.max(0.0, (double) (ageNow - since) / 1e9) : 0.0;
                }
            }
            boolean stale = beat != null && beat > ControlStatus.STALE_HEARTBEAT_S;
            boolean caughtUp = settled && supAlive && !stale && whole && !WAITING.equals(broker)
                    && parts.stream().allMatch(Partition::caughtUp);
            boolean gaps = parts.stream().anyMatch(Partition::gap);
            boolean accepted = supAlive && h(H_ACCEPT_GAPS) != 0;
            String lookupError = "";
            Double lookupFailing = null;
            if (supAlive) {
                for (int t = 0; t < TRIES; t++) {
                    long since = h(H_LOOKUP_FAILING_SINCE);
                    if (since == 0) {
                        break;
                    }
                    int len = (int) Math.min(Math.max(h(H_LOOKUP_TEXT_LEN), 0), LOOKUP_TEXT_MAX);
                    byte[] raw = bytes(H_LOOKUP_TEXT * WORD, len);
                    if (since > 0 && h(H_LOOKUP_FAILING_SINCE) == since) {
                        lookupError = new String(raw, StandardCharsets.UTF_8);
                        lookupFailing = Math.max(0.0, (double) (ageNow - since) / 1e9);
                        break;
                    }
                }
            }
            List<Integer> elsewhere = g.elsewhere.stream().filter(p -> !here.contains(p)).sorted().toList();
            Status st = new Status(name, topic, n, sup > 0 ? sup >> 32 : null, supAlive, beat, stale, parts,
                    unassigned, elsewhere, g.members, g.others, !g.others.isEmpty() || (g.members != null && g.members > 1),
                    caughtUp, caughtUp && (!gaps || accepted), accepted, !settled, broker, waiting, lookupError,
                    lookupFailing, gapParts, h(H_GAP_OFFSETS), "", "", List.copyOf(workers.values()));
            String[] rw = reasonWhy(st);
            return st.withReason(rw[0], rw[1]);
        }

        /** {p, row words...} of each partition p < n assigned here. */
        List<long[]> partitionRows(int n) {
            List<long[]> out = new ArrayList<>();
            for (int p = 0; p < n; p++) {
                long[] r = new long[1 + (int) ROW_WORDS];
                r[0] = p;
                for (int k = 0; k < ROW_WORDS; k++) {
                    r[1 + k] = row(PARTITIONS_OFF, p, k);
                }
                if (r[1 + P_ASSIGNED] != 0) {
                    out.add(r);
                }
            }
            return out;
        }

        /** The worker rows in use, by index, with their state as format section 14 judges it. */
        Map<Integer, Worker> workers(boolean supAlive) {
            long bound = supAlive ? h(H_WORKER_STALE_NS) : 0;
            Map<Long, Long> waits = new HashMap<>(); // a writer's lock wait by its owner word
            for (long i = 0; i < MAX_WRITERS; i++) {
                long o = row(WRITERS_OFF, i, W_OWNER), w = row(WRITERS_OFF, i, W_WAIT);
                if (o != 0 && 0 < w && w <= NBUCKETS) {
                    waits.put(o, w);
                }
            }
            Map<Integer, Worker> out = new TreeMap<>(); // in row order
            for (int i = 0; i < MAX_WORKERS; i++) {
                long owner = row(WORKERS_OFF, i, K_OWNER), hb = row(WORKERS_OFF, i, K_HEARTBEAT);
                if (owner == 0 && row(WORKERS_OFF, i, K_STARTS) == 0) {
                    continue;
                }
                boolean alive = m.alive(owner, (WORKERS_OFF + (i * ROW_WORDS + K_OWNER) * WORD) / WORD);
                String published = null;
                long failures = 0, restartAt = 0;
                if (supAlive) {
                    long handle = h(H_WORKER_HANDLES + i), code = handle & 0xFF;
                    published = code >= 1 && code <= WORKER_STATES.size() ? WORKER_STATES.get((int) code - 1) : null;
                    failures = handle >>> 8 & 0xFFFF;
                    restartAt = handle >> 24;
                }
                String state;
                if (alive) { // backing-off: killed by the supervisor, not gone yet
                    state = "stopping".equals(published) || "backing-off".equals(published) ? published : "up";
                } else if (!supAlive) {
                    state = "stopped";
                } else {
                    state = "backing-off".equals(published) || "stopping".equals(published)
                            || "stopped".equals(published) ? published : "starting";
                }
                Double beatAge = hb != 0 ? (double) (ageNow - hb) / 1e9 : null;
                boolean stale = alive && bound > 0 && hb > 0 && ageNow - hb > bound;
                Long wait = alive ? waits.get(owner) : null;
                out.put(i, new Worker(i, owner != 0 ? owner >> 32 : null, alive, state, failures,
                        restartAt > 0 && "backing-off".equals(published) ? restartAt / 10.0 : null, beatAge, stale,
                        wait == null ? null : wait - 1, row(WORKERS_OFF, i, K_STARTS), row(WORKERS_OFF, i, K_ADDS),
                        row(WORKERS_OFF, i, K_DELETES), row(WORKERS_OFF, i, K_MESSAGES),
                        row(WORKERS_OFF, i, K_MALFORMED), row(WORKERS_OFF, i, K_UNKNOWN)));
            }
            return out;
        }

        /** The group words, read between two looks at H_GROUP_CHECKED; a torn read is retried. */
        Group group(int n) {
            for (int t = 0; t < TRIES; t++) {
                long v = h(H_GROUP_CHECKED);
                if (v <= 0) {
                    return Group.NONE;
                }
                long len = h(H_GROUP_TEXT_LEN), members = h(H_GROUP_MEMBERS);
                byte[] raw = bytes(H_GROUP_TEXT * WORD, (int) Math.max(0, Math.min(len, GROUP_TEXT_MAX)));
                byte[] where = bytes(H_ELSEWHERE * WORD, n);
                if (h(H_GROUP_CHECKED) != v) {
                    continue;
                }
                List<Map<String, String>> listed = Json.members(raw);
                List<List<Integer>> held = new ArrayList<>();
                for (int i = 0; i < listed.size(); i++) {
                    held.add(new ArrayList<>());
                }
                List<Integer> unlisted = new ArrayList<>(), elsewhere = new ArrayList<>();
                for (int p = 0; p < n; p++) {
                    int b = where[p] & 0xFF;
                    if (b == 0) {
                        continue;
                    }
                    elsewhere.add(p);
                    if (b - 1 < listed.size()) {
                        held.get(b - 1).add(p);
                    } else {
                        unlisted.add(p);
                    }
                }
                List<Member> others = new ArrayList<>();
                for (int i = 0; i < listed.size(); i++) {
                    Map<String, String> o = listed.get(i);
                    others.add(new Member(o.get("client_id"), o.get("host"), o.get("instance_id"), held.get(i)));
                }
                if (!unlisted.isEmpty()) {
                    others.add(new Member("?", "?", "", unlisted));
                }
                return new Group(members > 0 ? members : null, others, elsewhere);
            }
            return Group.NONE;
        }
    }

    /** The group as the live supervisor last saw it. */
    private record Group(Long members, List<Member> others, List<Integer> elsewhere) {
        static final Group NONE = new Group(null, List.of(), List.of());
    }

    /** Why a partition's worker applies nothing now (null: it is up and beating). */
    private static String workerDown(Worker w) {
        if (w == null) {
            return "not running";
        }
        if (!w.state.equals("up")) {
            return w.state;
        }
        if (w.stale) {
            return "stale, no heartbeat for " + fixed(w.heartbeatAgeS, 0) + " s";
        }
        if (w.waitingForBucket != null) {
            return "waiting for bucket " + w.waitingForBucket + "'s lock, held by another live process";
        }
        return null;
    }

    /** (reason, why) by the table of format section 14; ("ready", "") when ready. */
    static String[] reasonWhy(Status st) {
        if (st.ready) {
            return new String[] {"ready", ""};
        }
        if (!st.supervisorAlive) {
            return new String[] {"no-supervisor", "no live supervisor"};
        }
        if (st.supervisorStale) {
            return new String[] {"supervisor-stale", "the supervisor (pid " + st.supervisorPid + ") has not gone round "
                    + "its loop for " + fixed(st.supervisorHeartbeatAgeS, 0) + " s: stopped or hung"};
        }
        if (WAITING.equals(st.broker)) {
            return new String[] {"broker-waiting", "waiting for the Kafka broker for " + fixed(st.brokerWaitingS, 0) + " s"};
        }
        if (!st.lookupError.isEmpty()) {
            return new String[] {"lookup-error", st.unassigned.size() + " of " + st.partitions + " partitions wait to be "
                    + "handed out: the broker answers, but " + st.lookupError + " (failing for "
                    + fixed(st.lookupFailingS, 0) + " s)"};
        }
        if (st.assigned.isEmpty() && st.elsewhere.isEmpty()) {
            return new String[] {"no-partitions", "no partitions assigned yet"};
        }
        if (st.assigning) {
            return new String[] {"assigning", "an assignment is being published"};
        }
        if (!st.unassigned.isEmpty()) {
            String text = st.unassigned.size() + " of " + st.partitions + " partitions not assigned to this cache";
            if (!st.elsewhere.isEmpty()) {
                text += " (" + st.elsewhere.size() + " held by another member of the group: "
                        + st.groupOthers.stream().map(o -> o.clientId + " on " + o.host).collect(Collectors.joining(", "))
                        + ")";
            }
            return new String[] {"unassigned", text};
        }
        List<String> lagging = new ArrayList<>();
        for (Partition p : st.assigned) {
            if (!p.caughtUp) {
                lagging.add(p.partition + " (lag " + (p.lag == null ? "unknown" : p.lag.toString())
                        + (p.workerDown == null ? ")" : p.worker == null ? ", no worker)"
                        : ", worker " + p.worker + " " + p.workerDown + ")"));
            }
        }
        if (lagging.isEmpty() && !st.gapPartitions.isEmpty()) {
            return new String[] {"gap", "retention gap: the topic deleted " + String.format(Locale.ROOT, "%,d", st.gapOffsets)
                    + " offsets of partitions " + st.gapPartitions.subList(0, Math.min(32, st.gapPartitions.size()))
                    + " before this cache had them, so the table lacks what they held; restore a snapshot taken "
                    + "before, or start the supervisor with --accept-gaps to serve it as it is"};
        }
        return new String[] {"lagging", "partitions not caught up: "
                + String.join(", ", lagging.subList(0, Math.min(20, lagging.size())))};
    }

    /**
     * x with {@code digits} decimals as Python's format spec {@code .Nf} writes it: the exact
     * binary value rounded half to even ("2" for 2.5, where Java's %.0f writes "3").
     */
    static String fixed(Double x, int digits) {
        if (x == null) {
            return "None";
        }
        BigDecimal d = new BigDecimal(x).setScale(digits, RoundingMode.HALF_EVEN);
        String s = d.toPlainString();
        return x < 0 && d.signum() == 0 ? "-" + s : s;
    }

    private static long wallNanos() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000_000L + now.getNano();
    }

    /** Strict UTF-8 (Python's bytes.decode()), null where the bytes are not UTF-8. */
    static String strictUtf8(byte[] raw) {
        try {
            return StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(raw)).toString();
        } catch (CharacterCodingException e) {
            return null;
        }
    }
}
