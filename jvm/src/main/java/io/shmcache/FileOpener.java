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
 * <p>{@link #INSTANCE} is what {@link Jdk} picks. On JDK 17-21 it is {@link ThreadOpener}:
 * Java 17's NIO cannot open with {@code O_NONBLOCK}, so each open runs on an opener thread
 * and the caller waits a bounded time (see there). On JDK 22+ it is {@code NativeOpener}
 * (src/main/java22), which calls {@code open(2)} with {@code O_NONBLOCK | O_NOFOLLOW |
 * O_CLOEXEC} through the foreign function API on the caller's thread, where this class's
 * module may call native code ({@code --enable-native-access}, which Spark passes and the
 * runnable jar's manifest sets); elsewhere, ThreadOpener again.
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

    /** An open file (its channel, opened with O_NOFOLLOW) and what lstat said of the name just after. */
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
