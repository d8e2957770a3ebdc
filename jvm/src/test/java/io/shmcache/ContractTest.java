package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.lang.reflect.Constructor;
import java.nio.file.Files;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * The contract's kinds (golden/contract.json) are this reader's: the word of every
 * {@link ShmcacheException} subclass (found by reflection, so a kind added is checked too),
 * and "error", the base class's.
 */
class ContractTest {
    @Test
    void everyKindIsTheContractsAndEveryContractKindIsOne() throws IOException, ReflectiveOperationException {
        String json = Files.readString(Goldens.DIR.resolve("contract.json"));
        Set<String> want = new TreeSet<>();
        Matcher m = Pattern.compile("\"kind\": \"([a-z-]+)\"").matcher(json);
        while (m.find()) {
            want.add(m.group(1));
        }
        Set<String> got = new TreeSet<>(Set.of(new ShmcacheException("x", "y", null).kind()));
        for (Class<?> c : ShmcacheException.class.getDeclaredClasses()) {
            if (!ShmcacheException.class.isAssignableFrom(c)) {
                continue;
            }
            Constructor<?> k = c.getDeclaredConstructors()[0];
            Object[] args = new Object[k.getParameterCount()];
            for (int i = 0; i < args.length; i++) {
                Class<?> t = k.getParameterTypes()[i];
                args[i] = t == String.class ? "x" : t == boolean.class ? false : null;
            }
            got.add(((ShmcacheException) k.newInstance(args)).kind());
        }
        assertFalse(want.isEmpty(), "no kinds read from golden/contract.json");
        assertEquals(want, got, "this reader's kinds against golden/contract.json's");
    }
}
