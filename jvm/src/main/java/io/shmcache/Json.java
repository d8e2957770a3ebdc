package io.shmcache;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.core.json.JsonReadFeature;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.PropertyNamingStrategies;
import com.fasterxml.jackson.databind.json.JsonMapper;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * JSON, by Jackson: the JSON Spark ships (a {@code provided} dependency; the runnable jar
 * names it in its manifest's Class-Path, as it names lz4-java). Used for status's group
 * text and the commands' output; nothing on the lookup path needs it.
 */
final class Json {
    private Json() {}

    /** Writes records with the contract's snake-case field names (supervisorPid: "supervisor_pid"). */
    private static final ObjectMapper OUT = JsonMapper.builder()
            .propertyNamingStrategy(PropertyNamingStrategies.SNAKE_CASE).build();
    /** Reads as Python's json.loads does: NaN and Infinity allowed, nothing after the value. */
    private static final ObjectMapper IN = JsonMapper.builder().enable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS)
            .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS).build();

    /** value as a JSON object, without the fields named in {@code drop} (snake case). */
    static String write(Object value, String... drop) {
        try {
            if (drop.length == 0) {
                return OUT.writeValueAsString(value);
            }
            com.fasterxml.jackson.databind.node.ObjectNode o = OUT.valueToTree(value);
            o.remove(java.util.List.of(drop));
            return OUT.writeValueAsString(o);
        } catch (JsonProcessingException | IllegalArgumentException e) {
            throw new IllegalStateException("shmcache: cannot write " + value.getClass().getSimpleName() + " as JSON", e);
        }
    }

    /**
     * The group text of format section 14: a JSON list of objects (anything else, or bytes
     * that are not UTF-8: an empty list), each reduced to the strings client_id, host and
     * instance_id (missing: ""), a value that is not a string written as Python's str() writes it.
     */
    static List<Map<String, String>> members(byte[] raw) {
        List<Map<String, String>> out = new ArrayList<>();
        if (raw.length == 0) {
            return out;
        }
        String text = Status.strictUtf8(raw);
        JsonNode root;
        try {
            root = text == null ? null : IN.readTree(text);
        } catch (JsonProcessingException e) {
            root = null;
        }
        if (root == null || !root.isArray()) {
            return out;
        }
        for (JsonNode o : root) {
            if (!o.isObject()) {
                return new ArrayList<>();
            }
        }
        for (JsonNode o : root) {
            Map<String, String> m = new LinkedHashMap<>();
            for (String k : new String[] {"client_id", "host", "instance_id"}) {
                JsonNode v = o.get(k);
                m.put(k, v == null ? "" : v.isTextual() ? v.textValue() : repr(v));
            }
            out.add(m);
        }
        return out;
    }

    /** A JSON value as Python's str() of what json.loads made of it: None, True, 1.5, [1, 'a'], {'k': 2}. */
    private static String repr(JsonNode v) {
        if (v.isNull()) {
            return "None";
        }
        if (v.isBoolean()) {
            return v.booleanValue() ? "True" : "False";
        }
        if (v.isTextual()) {
            String s = v.textValue();
            return s.contains("'") && !s.contains("\"") ? "\"" + s + "\"" : "'" + s.replace("'", "\\'") + "'";
        }
        if (v.isArray()) {
            List<String> items = new ArrayList<>();
            v.forEach(e -> items.add(repr(e)));
            return "[" + String.join(", ", items) + "]";
        }
        if (v.isObject()) {
            List<String> items = new ArrayList<>();
            for (Map.Entry<String, JsonNode> e : v.properties()) {
                items.add(repr(IN.getNodeFactory().textNode(e.getKey())) + ": " + repr(e.getValue()));
            }
            return "{" + String.join(", ", items) + "}";
        }
        return v.asText();
    }
}
