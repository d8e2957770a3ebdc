package io.shmcache;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.Path;

/**
 * How a reader opens a file at a name in /dev/shm (docs/segment-format.md section 1): never
 * following a symbolic link, never blocking (a FIFO at the name), keeping only a regular
 * file, and saying which file it opened. The one place a file is opened: the cache and its
 * readers' companion both come through here.
 *
 * <p>{@link #INSTANCE} is what {@link Jdk} picks: a {@link DescriptorOpener}, which calls
 * {@code open(2)} with {@code O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC} on the caller's thread and
 * makes every check on what it opened: on JDK 17-21 the {@link DispatcherOpener} (the JDK's
 * own {@code open}), on JDK 22+ {@code NativeOpener} (src/main/java22: the foreign function
 * API, where this class's module may call native code: {@code --enable-native-access}, which
 * Spark passes and the runnable jar's manifest sets). Where neither can serve (another JVM's
 * class library, or JDK 22+ without native access) the {@link ThreadOpener}: each open on an
 * opener thread, the caller waiting a bounded time (see there).
 */
interface FileOpener {
    FileOpener INSTANCE = Jdk.opener();

    /**
     * Opens path (read-only, or read-write with {@code write}) if a regular file is there.
     * Throws {@link ShmcacheException.NotFound} if nothing is there,
     * {@link ShmcacheException.NotACache} naming what is there if it is not a regular file
     * (or it did not open within the bound), {@link ShmcacheException.Permission} if this
     * process may not open it. {@code what} follows the path in messages
     * (" (its readers' companion)").
     */
    Opened open(String cache, Path path, boolean write, String what);

    /**
     * An open file (its channel) and what was seen of it: the fstat of that very file (a
     * DescriptorOpener), or, from the ThreadOpener, what lstat said of the name just after.
     */
    record Opened(FileChannel channel, FileStat stat) {
        /** Closes it (nothing was read from it, or nothing more will be). */
        void close() {
            try {
                channel.close();
            } catch (IOException ignored) {
                // nothing more is read from it
            }
        }
    }
}
