package io.shmcache;

import java.io.IOException;
import java.nio.file.FileSystems;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFileAttributes;
import java.nio.file.attribute.UserPrincipal;
import java.nio.file.attribute.UserPrincipalNotFoundException;

/**
 * The user whose cache a reader expects ({@link Segment#attach(String, Owner)}): any user
 * may create a name in /dev/shm before the cache's supervisor does, and serve any values
 * from it; a reader told its owner refuses a file another user owns, before reading any
 * byte of it. As Python's {@code attach(name, owner=...)}: a user name or a uid, the name
 * looked up on this machine (so on a cluster each executor resolves it on its own host).
 */
public final class Owner {
    private final String spec;
    private final UserPrincipal user; // the JDK's Unix principals are equal iff their uids are
    private final long uid;           // -1: given as a name (its uid is the principal's)

    private Owner(String spec, UserPrincipal user, long uid) {
        this.spec = spec;
        this.user = user;
        this.uid = uid;
    }

    /**
     * A user name, else a uid (digits), as Python's owner_uid: a name this machine knows is
     * the user of that name; digits that name no user are that uid.
     *
     * @throws IllegalArgumentException for an empty spec, or a name this machine does not have
     */
    public static Owner of(String cache, String spec) {
        if (spec == null || spec.isEmpty()) {
            throw new IllegalArgumentException("shmcache: cache '" + cache + "': owner=" + (spec == null ? "null" : "''")
                    + ": expected a user name or a uid");
        }
        UserPrincipal p;
        try {
            p = FileSystems.getDefault().getUserPrincipalLookupService().lookupPrincipalByName(spec);
        } catch (UserPrincipalNotFoundException e) {
            p = null;
        } catch (IOException | UnsupportedOperationException e) {
            throw new IllegalArgumentException("shmcache: cache '" + cache + "': owner='" + spec + "': cannot look "
                    + "users up on this machine: " + e, e);
        }
        long uid = -1;
        if (spec.chars().allMatch(c -> c >= '0' && c <= '9') && spec.length() <= 10) {
            uid = Long.parseLong(spec); // the JDK, too, takes digits that name no user as a uid
        }
        if (p == null || uid > 0xFFFFFFFFL || spec.matches("-[0-9]+")) { // the JDK would take "-1" as uid -1
            throw new IllegalArgumentException("shmcache: cache '" + cache + "': owner='" + spec + "': no such user on "
                    + "this machine (a user name or a uid)");
        }
        return new Owner(spec, p, uid);
    }

    /** The owner as given (a user name, or a uid's digits). */
    public String spec() {
        return spec;
    }

    /**
     * Throws {@link ShmcacheException.WrongOwner} naming both users unless the file at path
     * (not followed if a link) belongs to this owner; a reader calls it before it opens the file.
     */
    void check(String cache, Path path, PosixFileAttributes a, String what) {
        if (a.owner().equals(user)) {
            return;
        }
        long fileUid = -1;
        try {
            fileUid = ((Number) Files.getAttribute(path, "unix:uid", LinkOption.NOFOLLOW_LINKS)).longValue();
        } catch (IOException | UnsupportedOperationException | IllegalArgumentException e) {
            // named by its user name only
        }
        String name = a.owner().getName();
        String file = fileUid < 0 ? "user '" + name + "'"
                : "uid " + fileUid + (name.equals(Long.toString(fileUid)) ? "" : " (" + name + ")");
        throw new ShmcacheException.WrongOwner(cache, path + what + " belongs to " + file + ", not to " + expectedText()
                + " as its reader was told (owner=" + spec + "): refusing to read it (any user may create a name in "
                + "/dev/shm before its supervisor does)");
    }

    /**
     * This owner as Python's user_text words it, "uid 998 (shmcache)", with the other half
     * from /etc/passwd (the JDK resolves names, not uids); "user 'shmcache'" or "uid 998"
     * where /etc/passwd does not say. Only for messages.
     */
    private String expectedText() {
        long u = uid;
        String name = uid >= 0 ? null : spec;
        try {
            for (String line : Files.readAllLines(Path.of("/etc/passwd"))) {
                String[] f = line.split(":", 4);
                if (f.length < 3) {
                    continue;
                }
                if (uid < 0 && f[0].equals(spec)) {
                    u = Long.parseLong(f[2]);
                    break;
                }
                if (uid >= 0 && f[2].equals(Long.toString(uid))) {
                    name = f[0];
                    break;
                }
            }
        } catch (IOException | RuntimeException e) {
            // worded with what is known
        }
        if (u < 0) {
            return "user '" + name + "'";
        }
        return "uid " + u + (name == null ? "" : " (" + name + ")");
    }

    /** Whether the file of these attributes belongs to this owner. */
    boolean owns(PosixFileAttributes a) {
        return a.owner().equals(user);
    }

    @Override
    public String toString() {
        return spec;
    }
}
