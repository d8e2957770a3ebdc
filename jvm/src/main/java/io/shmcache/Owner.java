package io.shmcache;

import java.io.IOException;
import java.nio.file.FileSystems;
import java.nio.file.Path;
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
    private final UserPrincipal user; // the JDK's Unix principals are equal iff their uids are; null: by uid
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
        boolean digits = spec.matches("[0-9]{1,10}");
        long uid = digits ? Long.parseLong(spec) : -1;
        UserPrincipal p = null;
        if (digits || !takenAsUid(spec)) { // the JDK takes "+0", "-1" and other scripts' digits for a uid: never here
            try {
                p = FileSystems.getDefault().getUserPrincipalLookupService().lookupPrincipalByName(spec);
            } catch (UserPrincipalNotFoundException e) {
                p = null;
            } catch (IOException | UnsupportedOperationException e) {
                throw new IllegalArgumentException("shmcache: cache '" + cache + "': owner='" + spec + "': cannot look "
                        + "users up on this machine: " + e, e);
            }
        }
        if (p == null && !(digits && uid <= LARGEST_UID)) {
            throw new IllegalArgumentException("shmcache: cache '" + cache + "': owner='" + spec + "': no such user on "
                    + "this machine (a user name, or a uid from 0 to " + LARGEST_UID + ")");
        }
        return new Owner(spec, p, uid); // p null: a uid past the JDK's int, compared as a number
    }

    /** The largest uid an owner may name: 2^32 - 2 ((uid_t) -1 is no user's; golden/contract.json). */
    public static final long LARGEST_UID = 4294967294L;

    /** Whether the JDK's lookup would take spec, no user's name, as a uid (Integer.parseInt would). */
    private static boolean takenAsUid(String spec) {
        try {
            Integer.parseInt(spec);
            return true;
        } catch (NumberFormatException e) {
            return false;
        }
    }

    /** The owner as given (a user name, or a uid's digits). */
    public String spec() {
        return spec;
    }

    /**
     * Throws {@link ShmcacheException.WrongOwner} naming both users unless the file whose
     * lstat is {@code st} (the file at path, opened) belongs to this owner; a reader calls
     * it before it reads a byte of the file.
     */
    void check(String cache, Path path, FileStat st, String what) {
        if (owns(st)) {
            return;
        }
        String name = st.owner() == null ? null : st.owner().getName();
        String file = "uid " + st.uid() + (name == null || name.equals(Integer.toString(st.uid())) ? "" : " (" + name + ")");
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
        long u = uid >= 0 ? uid : Users.uidOf(spec);
        if (u < 0) {
            return "user '" + spec + "'";
        }
        return uid >= 0 ? Users.text(u) : "uid " + u + " (" + spec + ")";
    }

    /** Whether the file of this stat belongs to this owner. */
    boolean owns(FileStat st) {
        return user != null ? user.equals(st.owner()) : (st.uid() & 0xFFFFFFFFL) == uid;
    }

    @Override
    public String toString() {
        return spec;
    }
}
