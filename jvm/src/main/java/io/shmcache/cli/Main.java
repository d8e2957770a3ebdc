package io.shmcache.cli;

import io.shmcache.Owner;
import io.shmcache.Segment;
import io.shmcache.ShmcacheException;
import io.shmcache.Status;
import io.shmcache.TxMetaValue;
import java.io.PrintStream;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * {@code shmcache-jvm}: the commands every reader gives in the same words
 * (docs/reader-contract.md), run as {@code java -jar shmcache-jvm-<version>.jar COMMAND ...}:
 * <pre>
 * get [--owner USER] NAME HEXKEY...          a line a key: the value in hex, "-" for a miss; exit 0 all hit, 1 some missed
 * get [--owner USER] --decode txmeta NAME HEXKEY...   the same, each value as its txmeta decode, one JSON object
 * watch [--owner USER] NAME HEXKEY SECONDS   a line at each change of outcome: ELAPSED hit HEX | miss | error KIND: message
 * stats [--owner USER] [--json] NAME         the cache's figures, one JSON object
 * status [--owner USER] [--json] NAME        readiness and progress, one JSON object
 * wait-ready [--owner USER] [--timeout S] [--max-lag N] [--max-behind S] NAME   the status once ready, and no
 *     partition more than N messages or S seconds behind (exit 0); exit 1 not so by the timeout
 * </pre>
 * An error is one line on stderr, {@code shmcache-jvm: KIND: message} (KIND as
 * {@link ShmcacheException#kind()} names it), and exit status 2. JSON is printed with or
 * without {@code --json}.
 */
public final class Main {
    private Main() {}

    static final String PROGRAM = "shmcache-jvm";
    /** The contract's kind for an error that is none of {@link ShmcacheException}'s: the system refused. */
    public static final String OTHER_KIND = "error";
    private static final double WATCH_PACE_S = 0.01; // between a watch's lookups

    public static void main(String[] args) {
        // the JDK's log lines (a given-up bucket's warning) on one line each, not its two
        if (System.getProperty("java.util.logging.SimpleFormatter.format") == null) {
            System.setProperty("java.util.logging.SimpleFormatter.format", "%4$s: %5$s%n");
        }
        int code;
        try {
            code = run(args, System.out);
        } catch (Usage e) {
            code = error("bad-argument", e.getMessage());
        } catch (ShmcacheException e) {
            code = error(e.kind(), e.getMessage());
        } catch (IllegalArgumentException e) { // an unknown --owner user
            code = error("bad-argument", e.getMessage());
        } catch (RuntimeException e) { // anything else the system refused
            code = error(OTHER_KIND, String.valueOf(e));
        }
        System.out.flush();
        System.exit(code);
    }

    /** `PROGRAM: KIND: message` on stderr; exit status 2. */
    private static int error(String kind, String message) {
        System.err.println(PROGRAM + ": " + kind + ": " + oneLine(plain(message)));
        return 2;
    }

    /**
     * A message as one line of output (docs/reader-contract.md): a line break in it, as from
     * a name or an argument given with one, written as its escape.
     */
    static String oneLine(String message) {
        return message.replace("\r", "\\r").replace("\n", "\\n");
    }

    /** The message without this package's "shmcache: " prefix: the program's name stands there. */
    static String plain(String message) {
        String m = String.valueOf(message);
        return m.startsWith("shmcache: ") ? m.substring("shmcache: ".length()) : m;
    }

    /** A bad argument, worded for the one line of a bad-argument error. */
    static final class Usage extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Usage(String message) {
            super(message);
        }
    }

    /** The parsed command line: the command, its options and its positional arguments. */
    private record Args(String command, String owner, boolean json, String timeout, String maxLag, String maxBehind,
                        String decode, List<String> rest) {}

    /** What --help prints: the usage, a command a line. */
    static final String HELP = String.join("\n",
            "usage: java -jar shmcache-jvm-<version>.jar COMMAND [OPTIONS] NAME ...",
            "",
            "Reads a shmcache cache with the JVM reader (the readers' contract: docs/reader-contract.md).",
            "",
            "  get [--owner USER] [--decode txmeta] NAME HEXKEY...   a line a key: the value in hex, its decode, or -",
            "  watch [--owner USER] NAME HEXKEY SECONDS              a line each time the outcome changes",
            "  stats [--owner USER] [--json] NAME                    the stats, one JSON object",
            "  status [--owner USER] [--json] NAME                   readiness, one JSON object",
            "  wait-ready [--owner USER] [--timeout S] [--max-lag N] [--max-behind S] NAME",
            "                                                        exit 0 once ready (and no partition more than N",
            "                                                        messages or S seconds behind), 1 at the timeout",
            "",
            "Exit status: 0, 1 (get: a key missed; wait-ready: not ready in time), 2 (an error, one line",
            "on stderr: shmcache-jvm: KIND: message).",
            "");

    /** Whether argv asks for the usage: --help, -h or help, alone or after a command (not after --). */
    static boolean isHelp(String[] argv) {
        for (String a : argv) {
            if (a.equals("--")) {
                return false;
            }
            if (a.equals("--help") || a.equals("-h")) {
                return true;
            }
        }
        return argv.length == 1 && argv[0].equals("help");
    }

    static int run(String[] argv, PrintStream out) {
        if (isHelp(argv)) {
            out.print(HELP);
            return 0;
        }
        Args a = parse(argv);
        Owner owner = a.owner == null ? null : Owner.of(a.rest.isEmpty() ? "?" : a.rest.get(0), a.owner);
        return switch (a.command) {
            case "get" -> get(a, owner, out);
            case "watch" -> watch(a, owner, out);
            case "stats" -> stats(a, owner, out);
            case "status" -> status(a, owner, out);
            case "wait-ready" -> waitReady(a, owner, out);
            default -> throw new Usage("unknown command '" + a.command
                    + "' (commands: get, watch, stats, status, wait-ready)");
        };
    }

    /** The options that take a value, and the commands that take each. */
    private static final Map<String, List<String>> VALUED = Map.of(
            "--owner", List.of("get", "watch", "stats", "status", "wait-ready"),
            "--timeout", List.of("wait-ready"),
            "--max-lag", List.of("wait-ready"),
            "--max-behind", List.of("wait-ready"),
            "--decode", List.of("get"));

    private static Args parse(String[] argv) {
        if (argv.length == 0) {
            throw new Usage("a command is needed: get, watch, stats, status or wait-ready");
        }
        String command = argv[0];
        Map<String, String> given = new HashMap<>();
        boolean json = false, options = true;
        List<String> rest = new ArrayList<>();
        for (int i = 1; i < argv.length; i++) {
            String s = argv[i];
            String flag = s.contains("=") ? s.substring(0, s.indexOf('=')) : s;
            if (options && s.equals("--")) {
                options = false;
            } else if (options && VALUED.containsKey(flag)) {
                if (flag.equals(s)) {
                    if (i + 1 >= argv.length) {
                        throw new Usage(command + ": " + s + " needs a value");
                    }
                    given.put(flag, argv[++i]);
                } else {
                    given.put(flag, s.substring(flag.length() + 1));
                }
            } else if (options && s.equals("--json")) {
                json = true;
            } else if (options && s.startsWith("-") && s.length() > 1) {
                throw new Usage(command + ": unknown option " + s);
            } else {
                rest.add(s);
            }
        }
        for (String flag : given.keySet()) {
            if (!VALUED.get(flag).contains(command)) {
                throw new Usage(command + ": unknown option " + flag);
            }
        }
        if (json && (command.equals("get") || command.equals("watch"))) {
            throw new Usage(command + ": unknown option --json");
        }
        String decode = given.get("--decode");
        if (decode != null && !decode.equals("txmeta")) {
            throw new Usage("get: --decode '" + decode + "': the one format it decodes is txmeta");
        }
        return new Args(command, given.get("--owner"), json, given.get("--timeout"), given.get("--max-lag"),
                given.get("--max-behind"), decode, rest);
    }

    private static void need(Args a, int least, int most, String usage) {
        if (a.rest.size() < least || a.rest.size() > most) {
            throw new Usage(a.command + ": expected " + usage + ", got " + a.rest.size()
                    + " argument(s)");
        }
    }

    static byte[] hexKey(int i, String text) {
        try {
            return HexFormat.of().parseHex(text);
        } catch (IllegalArgumentException e) {
            throw new Usage("key " + i + " '" + text + "' is not hex");
        }
    }

    /** What a number of seconds is (golden/contract.json). */
    private static final java.util.regex.Pattern SECONDS = java.util.regex.Pattern.compile("[0-9]{1,9}(\\.[0-9]{1,9})?");

    /** What a count is (golden/contract.json): 1-18 ASCII digits, under 10^18. */
    private static final java.util.regex.Pattern COUNT = java.util.regex.Pattern.compile("[0-9]{1,18}");

    private static long count(String what, String text) {
        if (!COUNT.matcher(text).matches()) {
            throw new Usage(what + " '" + text + "' is not a count (1-18 digits)");
        }
        return Long.parseLong(text);
    }

    /**
     * A number of seconds as the contract has it: 1-9 ASCII digits, optionally a point and
     * 1-9 more; no sign, exponent, underscore, space or infinity (to wait for as long as it
     * takes, wait-ready is given no --timeout).
     */
    private static double seconds(String what, String text) {
        if (!SECONDS.matcher(text).matches()) {
            throw new Usage(what + " '" + text + "' is not a number of seconds (digits, optionally a point and more "
                    + "digits, under 10^9)");
        }
        return Double.parseDouble(text);
    }

    /**
     * get: every key in one call; exit 0 if every key hit, 1 if some missed. With
     * {@code --decode txmeta}, a value found prints as its decode's JSON object
     * ({@link TxMetaValue#json}; {@code {"valid":false}} for one that is not a txmeta value).
     */
    private static int get(Args a, Owner owner, PrintStream out) {
        need(a, 2, Integer.MAX_VALUE, "NAME HEXKEY...");
        byte[][] keys = new byte[a.rest.size() - 1][];
        for (int i = 0; i < keys.length; i++) {
            keys[i] = hexKey(i, a.rest.get(i + 1));
        }
        byte[][] values;
        try (Segment seg = Segment.attach(a.rest.get(0), owner)) {
            values = seg.getMany(keys);
        }
        StringBuilder sb = new StringBuilder();
        boolean all = true;
        for (byte[] v : values) {
            sb.append(v == null ? "-" : a.decode != null ? TxMetaValue.json(TxMetaValue.parse(v))
                    : HexFormat.of().formatHex(v)).append('\n');
            all &= v != null;
        }
        out.print(sb);
        return all ? 0 : 1;
    }

    /**
     * watch: the key looked up in a loop for SECONDS with a handle that follows the name, 10 ms
     * apart; a line, flushed, each time the outcome differs from the last (an error by its kind).
     */
    private static int watch(Args a, Owner owner, PrintStream out) {
        need(a, 3, 3, "NAME HEXKEY SECONDS");
        byte[] key = hexKey(0, a.rest.get(1));
        double seconds = seconds("SECONDS", a.rest.get(2));
        long start = System.nanoTime();
        String last = null;
        try (Segment seg = Segment.follow(a.rest.get(0), owner)) {
            while (true) { // one lookup at least, however short SECONDS: the first outcome is always told
                String what, same;
                try {
                    byte[] v = seg.get(key);
                    what = v == null ? "miss" : "hit " + HexFormat.of().formatHex(v);
                    same = what;
                } catch (ShmcacheException e) {
                    what = "error " + e.kind() + ": " + plain(e.getMessage());
                    same = "error " + e.kind();
                }
                if (!same.equals(last)) { // ELAPSED: when the outcome was known, after the lookup however long it took
                    last = same;
                    double now = (System.nanoTime() - start) / 1e9;
                    out.println(String.format(Locale.ROOT, "%.3f", now) + " " + oneLine(what));
                    out.flush();
                }
                if ((System.nanoTime() - start) / 1e9 >= seconds) {
                    return 0;
                }
                try {
                    Thread.sleep((long) (WATCH_PACE_S * 1000));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return 0;
                }
            }
        }
    }

    /** stats: the cache's figures (this command's handle looks nothing up). */
    private static int stats(Args a, Owner owner, PrintStream out) {
        need(a, 1, 1, "NAME");
        try (Segment seg = Segment.attach(a.rest.get(0), owner)) {
            out.println(seg.stats().toJson("hits", "misses", "read_retries")); // as Python's stats command
        }
        return 0;
    }

    /** status: readiness and progress. */
    private static int status(Args a, Owner owner, PrintStream out) {
        need(a, 1, 1, "NAME");
        try (Segment seg = Segment.attach(a.rest.get(0), owner)) {
            out.println(seg.status().toJson());
        }
        return 0;
    }

    /** wait-ready: the status once ready (0); not ready by the timeout (1, naming why not). */
    private static int waitReady(Args a, Owner owner, PrintStream out) {
        need(a, 1, 1, "NAME");
        double timeout = a.timeout == null ? Double.POSITIVE_INFINITY : seconds("--timeout", a.timeout);
        Status.Bound bound = new Status.Bound(a.maxLag == null ? null : count("--max-lag", a.maxLag),
                a.maxBehind == null ? null : seconds("--max-behind", a.maxBehind));
        try (Segment seg = Segment.follow(a.rest.get(0), owner)) {
            Status st = seg.waitReady(timeout, bound);
            out.println(st.toJson());
            return 0;
        } catch (ShmcacheException.NotReady e) {
            System.err.println(PROGRAM + ": " + e.kind() + ": " + oneLine(plain(e.getMessage())));
            return 1;
        }
    }
}
