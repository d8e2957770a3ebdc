package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.HexFormat;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/**
 * The owner and mode rule (format section 4): a file whose mode lets its group or others
 * write it is refused (unsafe mode), owner named or not, at attach and when it is re-created
 * at a followed name; a file this process may not open is a permission error of its own
 * (not "not a cache").
 */
class ModeTest {
    static final Goldens.Case BASE = Goldens.cases().get("base");
    static final Goldens.Key HIT = BASE.keys().get(1);

    final ShmFiles shm = new ShmFiles();

    @AfterEach
    void removeWhatWasMade() throws IOException {
        shm.removeAll();
    }

    static Path withMode(Path p, String mode) throws IOException {
        Files.setPosixFilePermissions(p, PosixFilePermissions.fromString(mode));
        return p;
    }

    @Test
    void aCacheItsGroupOrOthersMayWriteIsRefusedOwnerNamedOrNot() throws Exception {
        String name = shm.name("mode");
        Path at = Path.of(Layout.SHM_DIR, name);
        Goldens.write(at, Goldens.bytes(BASE));
        String me = Files.getOwner(at).getName();
        for (String mode : List.of("rw-rw-rw-", "rw--w----", "rw-r---w-", "rwxrwxrwx")) {
            withMode(at, mode);
            for (Owner owner : new Owner[] {null, Owner.of(name, me)}) {
                ShmcacheException e = assertThrows(ShmcacheException.UnsafeMode.class, () -> Segment.attach(name, owner),
                        mode + ", owner " + owner);
                assertEquals("unsafe-mode", e.kind());
                assertTrue(e.getMessage().contains(at.toString()) && e.getMessage().contains("its group or others may "
                        + "write it"), e.getMessage());
            }
        }
        for (String mode : List.of("rw-------", "rw-r-----", "rw-r--r--", "r--------")) {
            withMode(at, mode);
            try (Segment r = Segment.attach(name)) {
                assertArrayEquals(HIT.value(), r.get(HIT.key()), mode);
            }
        }
        try (Segment r = Segment.attach(name)) { // re-created by anyone, mode 0666: refused at the re-attach
            Path next = Path.of(at + ".next");
            withMode(Goldens.write(next, Goldens.bytes(BASE)), "rw-rw-rw-");
            Files.move(next, at, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
            long t0 = System.nanoTime();
            while (true) {
                try {
                    assertArrayEquals(HIT.value(), r.get(HIT.key()));
                } catch (ShmcacheException.UnsafeMode e) {
                    break;
                }
                assertTrue((System.nanoTime() - t0) / 1e9 < 0.5, "the re-created 0666 file is read");
            }
        }
    }

    @Test
    void aFileThisProcessMayNotOpenIsAPermissionError() throws Exception {
        String name = shm.name("perm");
        Path at = Path.of(Layout.SHM_DIR, name);
        Goldens.write(at, Goldens.bytes(BASE));
        Assumptions.assumeTrue(((Number) Files.getAttribute(at, "unix:uid")).intValue() == 0
                && Files.isExecutable(Path.of("/usr/bin/setpriv")),
                "needs root and setpriv: root without CAP_DAC_OVERRIDE meets a mode-0000 file it owns");
        withMode(at, "---------");
        // this process as root without the capabilities that override file permissions
        List<String> noOverride = List.of("setpriv", "--bounding-set=-dac_override,-dac_read_search");
        Child.Result r = Child.run(noOverride, "get", name, HexFormat.of().formatHex(HIT.key()));
        assertEquals(2, r.exit(), r.toString());
        assertTrue(r.err().startsWith("shmcache-jvm: permission: cache '" + name + "': permission denied opening " + at),
                r.err());
        assertEquals("", r.out());
        withMode(at, "rw-------");
        r = Child.run(noOverride, "get", name, HexFormat.of().formatHex(HIT.key()));
        assertEquals(0, r.exit(), r.toString());
        assertEquals(HexFormat.of().formatHex(HIT.value()) + "\n", r.out());
    }
}
