package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.lang.reflect.Constructor;
import java.nio.file.Files;
import java.util.Arrays;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import io.shmcache.cli.Main;
import org.junit.jupiter.api.Test;

/**
 * The contract's kinds (golden/contract.json) are this reader's: the word of every
 * {@link ShmcacheException} subclass (found by reflection, so a kind added is checked too),
 * each of which names its own and throws itself again as itself, and "error", the
 * command's word for whatever else the system refused.
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
        Set<String> got = new TreeSet<>(Set.of(Main.OTHER_KIND));
        for (Class<?> c : ShmcacheException.class.getDeclaredClasses()) {
            if (!ShmcacheException.class.isAssignableFrom(c)) {
                continue;
            }
            assertNotNull(c.getDeclaredMethod("kind"), c.getSimpleName() + " names no kind of its own");
            Constructor<?> k = Arrays.stream(c.getDeclaredConstructors())
                    .filter(x -> Arrays.stream(x.getParameterTypes()).noneMatch(ShmcacheException.class::isAssignableFrom))
                    .findFirst().orElseThrow();
            k.setAccessible(true);
            Object[] args = new Object[k.getParameterCount()];
            for (int i = 0; i < args.length; i++) {
                Class<?> t = k.getParameterTypes()[i];
                args[i] = t == String.class ? "x" : t == boolean.class ? false : null;
            }
            ShmcacheException e = (ShmcacheException) k.newInstance(args);
            ShmcacheException again = e.again();
            assertEquals(c, again.getClass(), c.getSimpleName() + " thrown again is another class");
            assertEquals(e.getMessage(), again.getMessage(), c.getSimpleName() + " thrown again says otherwise");
            got.add(e.kind());
        }
        assertFalse(want.isEmpty(), "no kinds read from golden/contract.json");
        assertEquals(want, got, "this reader's kinds against golden/contract.json's");
    }
}
