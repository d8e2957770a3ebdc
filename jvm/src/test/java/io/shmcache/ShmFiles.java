package io.shmcache;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * The names a test makes under /dev/shm, removed after it: each segment, the ".next" file a
 * re-created cache is written to before it is moved over the name, and its readers' companion.
 */
final class ShmFiles {
    private final List<Path> made = new ArrayList<>();

    /** A name of this process's own for the test's segment {@code what}, remembered for removal. */
    String name(String what) {
        String name = "jvmtest-" + ProcessHandle.current().pid() + "-" + what;
        made.add(Path.of(Layout.SHM_DIR, name));
        made.add(Path.of(Layout.SHM_DIR, name + ".next"));
        made.add(Companion.pathOf(name));
        return name;
    }

    /** Remove every file of every name handed out (those never made are skipped). */
    void removeAll() throws IOException {
        for (Path p : made) {
            Files.deleteIfExists(p);
        }
        made.clear();
    }
}
