package io.shmcache;

import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A reader told whose cache it reads (Segment.attach(name, owner)) refuses a file another
 * user owns, naming both, at attach and at every re-attach, before reading it. The other
 * user is uid 12345 (no such user here): copies of the base golden segment are chowned to
 * it, which takes root (skipped otherwise). Files made in /dev/shm are removed after each test.
 */
class OwnerTest {
    static final Goldens.Case BASE = Goldens.cases().get("base");
    static final int STRANGER = 12345;

    @TempDir
    Path tmp;
    final ShmFiles shm = new ShmFiles();
    int me;
    String myName;

    @BeforeEach
    void needRoot() throws IOException {
        me = ((Number) Files.getAttribute(tmp, "unix:uid")).intValue();
        myName = Files.getOwner(tmp).getName();
        Assumptions.assumeTrue(me == 0, "chown to another uid takes root");
    }

    @AfterEach
    void removeWhatWasMade() throws IOException {
        shm.removeAll();
    }

    private static Path chown(Path p, int uid) throws IOException {
        Files.setAttribute(p, "unix:uid", uid, LinkOption.NOFOLLOW_LINKS);
        return p;
    }

    @Test
    void aFileAnotherUserOwnsIsRefusedNamingBoth() throws IOException {
        Path p = chown(Goldens.write(tmp.resolve("stranger.shm"), Goldens.bytes(BASE)), STRANGER);
        for (String told : List.of(myName, Integer.toString(me))) {
            ShmcacheException.WrongOwner e = assertThrows(ShmcacheException.WrongOwner.class,
                    () -> Segment.attachPath(p, Owner.of("x", told)));
            String m = e.getMessage();
            assertTrue(m.contains("uid " + STRANGER) && m.contains(p.toString()) && m.contains("owner=" + told)
                    && (m.contains("uid " + me) || m.contains("user '" + myName + "'")), m);
        }
        Goldens.Key hit = BASE.keys().get(1);
        try (Segment r = Segment.attachPath(p, Owner.of("x", Integer.toString(STRANGER)))) { // its owner: read
            assertArrayEquals(hit.value(), r.get(hit.key()));
        }
        String name = shm.name("stranger");
        Files.copy(p, Path.of(Layout.SHM_DIR, name));
        chown(Path.of(Layout.SHM_DIR, name), STRANGER);
        ShmcacheException e = assertThrows(ShmcacheException.WrongOwner.class,
                () -> Segment.attach(name, Owner.of(name, myName)));
        assertTrue(e.getMessage().contains("cache '" + name + "'"), e.getMessage());
        try (Segment r = Segment.attach(name)) { // told no owner: any
            assertArrayEquals(hit.value(), r.get(hit.key()));
        }
    }

    @Test
    void aCacheRecreatedByAnotherUserIsRefusedAtReattach() throws Exception {
        String name = shm.name("reattach");
        Path at = Path.of(Layout.SHM_DIR, name), next = Path.of(Layout.SHM_DIR, name + ".next");
        Goldens.write(at, Goldens.bytes(BASE));
        Goldens.Key hit = BASE.keys().get(1);
        try (Segment r = Segment.attach(name, Owner.of(name, myName))) {
            assertArrayEquals(hit.value(), r.get(hit.key()));
            chown(Goldens.write(next, Goldens.bytes(BASE)), STRANGER); // the same bytes: only the owner tells
            Files.move(next, at, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
            long deadline = System.nanoTime() + 5_000_000_000L;
            ShmcacheException.WrongOwner refused = null;
            while (refused == null) {
                try {
                    r.get(hit.key());
                } catch (ShmcacheException.WrongOwner e) {
                    refused = e;
                }
                assertTrue(System.nanoTime() < deadline, "the stranger's file was read");
            }
            assertTrue(refused.getMessage().contains("uid " + STRANGER) && refused.getMessage().contains(name),
                    refused.getMessage());
            assertThrows(ShmcacheException.WrongOwner.class, () -> r.get(hit.key()), "and stays so");
            // the owner's cache again at the name: read again
            Goldens.write(next, Goldens.bytes(BASE));
            Files.move(next, at, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
            r.check();
            assertArrayEquals(hit.value(), r.get(hit.key()));
        }
    }

    @Test
    void anotherUsersCompanionIsNotCountedIn() throws Exception {
        String name = shm.name("companion");
        byte[] data = Goldens.bytes(BASE);
        Goldens.write(Path.of(Layout.SHM_DIR, name), data);
        byte[] comp = Goldens.companion(data);
        Goldens.putWord(comp, Layout.PAGE + Layout.ReaderStats.R_HITS * 8L, 5); // the stranger's sums: not ours to add to
        chown(Goldens.write(Companion.pathOf(name), comp), STRANGER);
        byte[][] keys = BASE.keys().stream().map(Goldens.Key::key).toArray(byte[][]::new);
        long hits = BASE.keys().stream().filter(k -> k.value() != null).count();
        try (Segment r = Segment.attach(name, Owner.of(name, myName))) {
            r.getMany(keys);
            Segment.Stats s = r.stats();
            assertEquals(hits, s.hits());
            assertEquals(0, s.readerHits(), "the companion is not read (as Python: no companion, no reader sums)");
        }
        assertArrayEquals(comp, Files.readAllBytes(Companion.pathOf(name)), "and not written");
        try (Segment r = Segment.attach(name)) { // told no owner: counted in
            r.getMany(keys);
            assertEquals(5 + hits, r.stats().readerHits());
        }
    }

    @Test
    void anUnknownUserNameIsAnError() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> Owner.of("c", "no-such-user-shmcache-40"));
        assertTrue(e.getMessage().contains("no such user") && e.getMessage().contains("no-such-user-shmcache-40"));
        assertEquals("54321", Owner.of("c", "54321").spec(), "digits that name no user are a uid");
    }
}
