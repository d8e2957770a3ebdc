package io.shmcache.spark;

import static org.junit.jupiter.api.Assertions.*;

import com.fasterxml.jackson.databind.JsonNode;
import io.shmcache.TxMetaValue;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.Random;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.junit.jupiter.api.Test;

/**
 * shmcache_txmeta's decoder on the golden txmeta values that the Python and Go decoders
 * are held to as well (golden/txmeta/cases.json, made by tests/lib/shmtest/golden_txmeta.py), and on
 * hand-made values: the fields of a record, a missing height, no parents, and every
 * malformed shape a null, never an exception; and the JSON object {@code get --decode
 * txmeta} prints (TxMetaValue.json, the same parse) for every golden value.
 */
class TxMetaTest {
    static final Path CASES = Path.of(System.getProperty("shmcache.golden", "../golden"), "txmeta", "cases.json");

    /** A decoded row as a golden case's expect object: the same fields, or {"valid": false} for null. */
    static JsonNode asExpect(ObjectMapper json, InternalRow r) {
        if (r == null) {
            return json.createObjectNode().put("valid", false);
        }
        HexFormat hex = HexFormat.of();
        var o = json.createObjectNode();
        o.put("fee", new BigInteger(Long.toUnsignedString(r.getLong(0))));
        o.put("size", new BigInteger(Long.toUnsignedString(r.getLong(1))));
        o.put("flags", r.getInt(2));
        var parents = o.putArray("parents");
        ArrayData ps = r.getArray(3);
        for (int j = 0; j < ps.numElements(); j++) {
            parents.add(hex.formatHex(ps.getBinary(j)));
        }
        var vouts = o.putArray("parent_vouts");
        ArrayData vs = r.getArray(4);
        for (int j = 0; j < vs.numElements(); j++) {
            var list = vouts.addArray();
            for (long v : vs.getArray(j).toLongArray()) {
                list.add(v);
            }
        }
        if (r.isNullAt(5)) {
            o.putNull("block_height");
        } else {
            o.put("block_height", r.getLong(5));
        }
        return o;
    }

    @Test
    void everyGoldenValueDecodesAsExpected() throws IOException {
        ObjectMapper json = new ObjectMapper();
        JsonNode cases = json.readTree(CASES.toFile()).get("cases");
        List<String> wrong = new ArrayList<>();
        int malformed = 0;
        for (JsonNode c : cases) {
            JsonNode want = c.get("expect");
            malformed += want.has("valid") ? 1 : 0;
            JsonNode got = asExpect(json, TxMeta.decode(HexFormat.of().parseHex(c.get("value").asText())));
            if (!got.toString().equals(want.toString())) { // as text: 1234 parsed is an int node, built a BigInteger
                wrong.add(c.get("name").asText() + ": " + got);
            }
        }
        assertTrue(malformed >= 400, malformed + " malformed golden values");
        assertEquals(List.of(), wrong.subList(0, Math.min(5, wrong.size())), wrong.size() + " golden values decoded otherwise");
    }

    @Test
    void everyGoldenValuePrintsItsExpectedObjectForGetDecodeTxmeta() throws IOException {
        ObjectMapper json = new ObjectMapper();
        List<String> wrong = new ArrayList<>();
        for (JsonNode c : json.readTree(CASES.toFile()).get("cases")) {
            String line = TxMetaValue.json(TxMetaValue.parse(HexFormat.of().parseHex(c.get("value").asText())));
            // both parsed from text by one mapper: 2**64-1 is a BigInteger node in each
            if (line.contains("\n") || !json.readTree(line).equals(json.readTree(c.get("expect").toString()))) {
                wrong.add(c.get("name").asText() + ": " + line);
            }
        }
        assertEquals(List.of(), wrong.subList(0, Math.min(5, wrong.size())), wrong.size() + " golden values printed otherwise");
    }

    /** A MetaBytes record: parents i of 32 bytes (i + 1), vout lists as given, height or -1. */
    static byte[] record(long fee, long size, int flags, int[][] vouts, long height) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteBuffer b = ByteBuffer.allocate(21).order(ByteOrder.LITTLE_ENDIAN);
        b.putLong(fee).putLong(size).put((byte) flags).putInt(vouts.length);
        out.writeBytes(b.array());
        for (int i = 0; i < vouts.length; i++) {
            byte[] h = new byte[32];
            Arrays.fill(h, (byte) (i + 1));
            out.writeBytes(h);
        }
        for (int[] vs : vouts) {
            ByteBuffer v = ByteBuffer.allocate(4 + 4 * vs.length).order(ByteOrder.LITTLE_ENDIAN).putInt(vs.length);
            for (int x : vs) {
                v.putInt(x);
            }
            out.writeBytes(v.array());
        }
        if (height >= 0) {
            out.writeBytes(ByteBuffer.allocate(4).order(ByteOrder.BIG_ENDIAN).putInt((int) height).array());
        }
        return out.toByteArray();
    }

    @Test
    void aRecordDecodesIntoTheColumns() {
        InternalRow r = TxMeta.decode(record(-5L, 300, 1, new int[][] {{0, -1}, {7}}, 850_123));
        assertEquals(-5L, r.getLong(0), "a u64 past 2**63 is the signed long of its bits");
        assertEquals(300, r.getLong(1));
        assertEquals(1, r.getInt(2));
        assertEquals(2, r.getArray(3).numElements());
        assertArrayEquals(filled(2), r.getArray(3).getBinary(1));
        assertArrayEquals(new long[] {0, 0xFFFFFFFFL}, r.getArray(4).getArray(0).toLongArray(), "vouts are u32");
        assertArrayEquals(new long[] {7}, r.getArray(4).getArray(1).toLongArray());
        assertEquals(850_123, r.getLong(5));
        InternalRow noHeight = TxMeta.decode(record(1, 2, 0, new int[][] {{3}}, -1));
        assertTrue(noHeight.isNullAt(5));
        InternalRow none = TxMeta.decode(record(1, 2, 255, new int[0][], -1));
        assertEquals(0, none.getArray(3).numElements());
        assertEquals(255, none.getInt(2));
        assertNull(TxMeta.decode(null));
    }

    private static byte[] filled(int b) {
        byte[] h = new byte[32];
        Arrays.fill(h, (byte) b);
        return h;
    }

    @Test
    void malformedValuesAreNullNeverAnError() {
        byte[] ok = record(1, 2, 0, new int[][] {{1, 2}, {3}}, 9);
        for (int cut = 0; cut < ok.length; cut++) {
            byte[] v = Arrays.copyOf(ok, cut);
            InternalRow r = TxMeta.decode(v);
            // cutting the 4-byte height off leaves a record without one; any other cut is damage
            assertEquals(cut == ok.length - 4, r != null, "cut at " + cut);
        }
        for (int extra : new int[] {1, 2, 3, 5, 8}) {
            assertNull(TxMeta.decode(Arrays.copyOf(ok, ok.length + extra)), "+" + extra + " bytes");
        }
        byte[] count = ok.clone();
        ByteBuffer.wrap(count).order(ByteOrder.LITTLE_ENDIAN).putInt(17, -1); // 2**32-1 parents
        assertNull(TxMeta.decode(count));
        byte[] vouts = ok.clone();
        ByteBuffer.wrap(vouts).order(ByteOrder.LITTLE_ENDIAN).putInt(21 + 64, -1); // 2**32-1 vouts
        assertNull(TxMeta.decode(vouts));
        Random rnd = new Random(40);
        for (int i = 0; i < 20_000; i++) { // whatever the bytes say
            byte[] v = new byte[rnd.nextInt(200)];
            rnd.nextBytes(v);
            if (v.length > 20 && rnd.nextBoolean()) {
                v[17] = (byte) rnd.nextInt(4);
                v[18] = v[19] = v[20] = 0;
            }
            TxMeta.decode(v);
        }
    }
}
