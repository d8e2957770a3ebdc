package io.shmcache;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.zip.GZIPInputStream;

/** The golden segments (../golden, docs/segment-format.md section 12) and their expectations. */
final class Goldens {
    private Goldens() {}

    static final Path DIR = Path.of(System.getProperty("shmcache.golden", "../golden"));
    static final HexFormat HEX = HexFormat.of();

    record Key(byte[] key, byte[] value, boolean corrupt, String why) {}

    record Case(String name, String file, String attachError, String field, Long entries, List<Key> keys,
                Long liveHolderOffset) {}

    /** The keys laid end to end, key i at i * its length (Call.getPacked's input). */
    static byte[] endToEnd(byte[][] keys) {
        int ks = keys[0].length;
        byte[] flat = new byte[keys.length * ks];
        for (int i = 0; i < keys.length; i++) {
            System.arraycopy(keys[i], 0, flat, i * ks, ks);
        }
        return flat;
    }

    static Map<String, Case> cases() {
        try {
            JsonNode root = new ObjectMapper().readTree(DIR.resolve("expect.json").toFile()).get("cases");
            Map<String, Case> out = new TreeMap<>();
            for (Iterator<Map.Entry<String, JsonNode>> it = root.fields(); it.hasNext();) {
                Map.Entry<String, JsonNode> e = it.next();
                JsonNode c = e.getValue();
                List<Key> keys = new ArrayList<>();
                if (c.has("keys")) {
                    for (JsonNode k : c.get("keys")) {
                        JsonNode v = k.get("value");
                        keys.add(new Key(HEX.parseHex(k.get("key").asText()), v.isNull() ? null : HEX.parseHex(v.asText()),
                                k.get("corrupt").asBoolean(), k.get("why").asText()));
                    }
                }
                out.put(e.getKey(), new Case(e.getKey(), c.get("file").asText(),
                        c.has("attach_error") ? c.get("attach_error").asText() : null,
                        c.has("field") && !c.get("field").isNull() ? c.get("field").asText() : null,
                        c.has("entries") ? c.get("entries").asLong() : null, keys,
                        c.has("live_holder_offset") ? c.get("live_holder_offset").asLong() : null));
            }
            return out;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    static byte[] bytes(Case c) {
        try (InputStream in = new GZIPInputStream(Files.newInputStream(DIR.resolve(c.file())))) {
            return in.readAllBytes();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Keys laid end to end, key_size bytes each, as an array of keys (Call.getBatch's input). */
    static byte[][] split(byte[] flat, int keySize) {
        byte[][] keys = new byte[flat.length / keySize][];
        for (int i = 0; i < keys.length; i++) {
            keys[i] = java.util.Arrays.copyOfRange(flat, i * keySize, (i + 1) * keySize);
        }
        return keys;
    }

    /** An empty readers' companion (format section 13) of the cache whose bytes are data. */
    static byte[] companion(byte[] data) {
        byte[] comp = new byte[(int) Layout.COMPANION_BYTES];
        putWord(comp, 0, Layout.ReaderStats.MAGIC);
        putWord(comp, Layout.WORD, Layout.ReaderStats.VERSION);
        putWord(comp, Layout.ReaderStats.H_CREATION_ID * Layout.WORD, word(data, Layout.H_CREATION_ID * Layout.WORD));
        return comp;
    }

    static long word(byte[] data, long off) {
        return ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN).getLong((int) off);
    }

    static void putWord(byte[] data, long off, long word) {
        ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN).putLong((int) off, word);
    }

    /** Writes data to a new file at path (which must not exist). */
    static Path write(Path path, byte[] data) {
        try {
            Files.write(path, data, java.nio.file.StandardOpenOption.CREATE_NEW, java.nio.file.StandardOpenOption.WRITE);
            return path;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
