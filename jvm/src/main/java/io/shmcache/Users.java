package io.shmcache;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;

/** Users as messages name them, "uid 998 (shmcache)", as Python's user_text words them. Only for messages. */
final class Users {
    private Users() {}

    /** "uid N (name)", or "uid N" where /etc/passwd has no such uid. */
    static String text(long uid) {
        String name = field(2, Long.toString(uid), 0);
        return "uid " + uid + (name == null ? "" : " (" + name + ")");
    }

    /** The uid of user name in /etc/passwd, -1 if it is not there (the JDK resolves names through NSS). */
    static long uidOf(String name) {
        String uid = field(0, name, 2);
        try {
            return uid == null ? -1 : Long.parseLong(uid);
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    /** Field {@code want} of the first /etc/passwd line whose field {@code key} is {@code value}. */
    private static String field(int key, String value, int want) {
        try {
            for (String line : Files.readAllLines(Path.of("/etc/passwd"))) {
                String[] f = line.split(":", 4);
                if (f.length >= 3 && f[key].equals(value)) {
                    return f[want];
                }
            }
        } catch (IOException | RuntimeException e) {
            // worded with what is known
        }
        return null;
    }
}
