package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/**
 * Every constant of {@link Layout} is a row of docs/segment-format.md's tables, with the
 * document's value (the Python side is tests/engine/test_segment_spec.py, Go's
 * go/layout_test.go): a row {@code | `NAME` | value |} whose name is upper case, or
 * module-qualified ({@code reader_stats.MAGIC} is {@link Layout.ReaderStats#MAGIC}). The
 * few constants derived from the tables are checked against the document's derivations.
 */
class LayoutTest {
    static final Path DOC = Goldens.DIR.resolve("../docs/segment-format.md");
    static final Pattern ROW = Pattern.compile("(?m)^\\| `([A-Za-z_.]+)` \\| ([^|]+?) \\|");
    static final Pattern NAME = Pattern.compile("([a-z_]+\\.)?[A-Z][A-Z0-9_]*");
    /** Derived from the tables, not rows of them (each checked below). */
    static final Set<String> DERIVED = Set.of("WRITERS_OFF", "WORKERS_OFF", "PARTITIONS_OFF", "META_OFF",
            "COMPANION_BYTES", "STUCK_GIVE_UP_NS", "FOLLOW_INTERVAL_NS", "SHM_DIR");
    /** Layout's nested classes and the document's module prefix of their constants. */
    static final Map<Class<?>, String> MODULES = Map.of(Layout.class, "", Layout.ReaderStats.class, "reader_stats.",
            Layout.Reader.class, "reader.", Layout.ControlStatus.class, "control_status.");

    static Map<String, String> documentRows() throws IOException {
        Map<String, String> rows = new LinkedHashMap<>();
        Matcher m = ROW.matcher(Files.readString(DOC));
        while (m.find()) {
            if (NAME.matcher(m.group(1)).matches()) {
                rows.put(m.group(1), m.group(2).trim().replace("`", ""));
            }
        }
        return rows;
    }

    /** The document's text of a value this package holds. */
    static boolean same(String doc, Object value) {
        if (value instanceof List<?> l) {
            return Arrays.stream(doc.split(",")).map(String::trim).toList().equals(l);
        }
        if (value instanceof Double d) {
            return Double.parseDouble(doc) == d;
        }
        long n = ((Number) value).longValue();
        return (doc.startsWith("0x") ? Long.parseUnsignedLong(doc.substring(2), 16) : Long.parseLong(doc)) == n;
    }

    @Test
    void everyConstantIsTheDocumentsRowOfItsName() throws Exception {
        Map<String, String> rows = documentRows();
        assertTrue(rows.size() >= 90, "the tables were read: " + rows.size() + " rows");
        List<String> wrong = new ArrayList<>();
        int checked = 0;
        for (Map.Entry<Class<?>, String> mod : MODULES.entrySet()) {
            for (Field f : mod.getKey().getDeclaredFields()) {
                if (!Modifier.isStatic(f.getModifiers()) || !Modifier.isFinal(f.getModifiers()) || f.isSynthetic()
                        || DERIVED.contains(f.getName())) {
                    continue;
                }
                f.setAccessible(true);
                String doc = mod.getValue() + f.getName();
                String text = rows.get(doc);
                if (text == null) {
                    wrong.add(doc + " is not a row of the document's tables");
                } else if (!same(text, f.get(null))) {
                    wrong.add("the document gives " + doc + " = " + text + "; Layout has " + f.get(null));
                }
                checked++;
            }
        }
        assertEquals(List.of(), wrong);
        assertTrue(checked > 90, checked + " constants checked");
    }

    @Test
    void theDerivedConstantsAreTheDocumentsDerivations() throws IOException {
        String doc = Files.readString(DOC);
        Matcher m = Pattern.compile("`meta_off` = (\\d+) and `index_off` = (\\d+)").matcher(doc);
        assertTrue(m.find(), "section 3 states meta_off and index_off");
        assertEquals(Long.parseLong(m.group(1)), Layout.META_OFF);
        assertEquals(Long.parseLong(m.group(2)), Layout.FIXED_BYTES);
        assertEquals(Layout.PAGE + Layout.ReaderStats.MAX_READERS * Layout.ROW_WORDS * Layout.WORD,
                Layout.COMPANION_BYTES, "section 13: PAGE + MAX_READERS * ROW_WORDS * WORD");
        assertEquals(Layout.PAGE, Layout.WRITERS_OFF);
        assertEquals(Layout.META_OFF - Layout.MAX_PARTITIONS * Layout.ROW_WORDS * Layout.WORD, Layout.PARTITIONS_OFF);
        assertEquals(1_000_000_000L, Layout.STUCK_GIVE_UP_NS);
        assertEquals(Layout.POS_MASK, (1L << Layout.POS_BITS) - 1);
        assertTrue(doc.contains("at least every 0.1 s"), "section 1's look at the name");
        assertEquals(100_000_000L, Layout.FOLLOW_INTERVAL_NS);
    }

    @Test
    void theDocumentsRowsThisReaderNeedsAreAllHere() throws Exception {
        // every row but the words a reader never reads (head, tail: the writers'; a dead or pad record is not live)
        Set<String> unread = Set.of("M_HEAD", "M_TAIL", "F_DEAD", "F_PAD");
        Set<String> have = MODULES.entrySet().stream().flatMap(e -> Arrays.stream(e.getKey().getDeclaredFields())
                .map(f -> e.getValue() + f.getName())).collect(Collectors.toSet());
        List<String> missing = documentRows().keySet().stream().filter(n -> !have.contains(n) && !unread.contains(n))
                .toList();
        assertEquals(List.of(), missing, "rows of the document with no constant here");
    }
}
