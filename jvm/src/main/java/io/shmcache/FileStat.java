package io.shmcache;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.attribute.UserPrincipal;
import java.util.Map;

/**
 * What {@code lstat(2)} says of a name (no link followed), or {@code fstat(2)} of an open
 * file ({@link #ofOpen}): the file's identity (device, inode), its type and mode bits, its
 * owner and its size. Every check of an opened file is made on its fstat
 * ({@link DescriptorOpener}); only the {@link ThreadOpener}, the fallback where no
 * descriptor can be had, looks at the name before and after it opens it.
 */
record FileStat(long dev, long ino, int mode, int uid, UserPrincipal owner, long size) {
    private static final int S_IFMT = 0170000, S_IFREG = 0100000, S_IFDIR = 0040000, S_IFLNK = 0120000,
            S_IFIFO = 0010000, S_IFSOCK = 0140000, S_IFCHR = 0020000, S_IFBLK = 0060000;

    /** What is at path now, without following a link; null if nothing is there. */
    static FileStat of(Path path) throws IOException {
        Map<String, Object> a;
        try {
            a = Files.readAttributes(path, ATTRIBUTES, LinkOption.NOFOLLOW_LINKS);
        } catch (NoSuchFileException e) {
            return null;
        }
        return of(a);
    }

    /**
     * The file a descriptor holds open, by its name in /proc/self/fd: that name is a link to
     * the open file itself (not to a path), so this is the descriptor's fstat.
     */
    static FileStat ofOpen(Path fd) throws IOException {
        return of(Files.readAttributes(fd, ATTRIBUTES));
    }

    private static final String ATTRIBUTES = "unix:dev,ino,mode,uid,owner,size";

    private static FileStat of(Map<String, Object> a) {
        return new FileStat(((Number) a.get("dev")).longValue(), ((Number) a.get("ino")).longValue(),
                ((Number) a.get("mode")).intValue(), ((Number) a.get("uid")).intValue(), (UserPrincipal) a.get("owner"),
                ((Number) a.get("size")).longValue());
    }

    /** Identity, mode and size only, for the look at the name a following handle makes every 0.1 s. */
    static FileStat identity(Path path) {
        try {
            Map<String, Object> a = Files.readAttributes(path, "unix:dev,ino,mode,size", LinkOption.NOFOLLOW_LINKS);
            return new FileStat(((Number) a.get("dev")).longValue(), ((Number) a.get("ino")).longValue(),
                    ((Number) a.get("mode")).intValue(), -1, null, ((Number) a.get("size")).longValue());
        } catch (IOException e) {
            return null; // nothing there (or nothing this process may look at: nothing usable)
        }
    }

    boolean isRegular() {
        return (mode & S_IFMT) == S_IFREG;
    }

    /** The same file (device and inode) as other. */
    boolean sameFile(FileStat other) {
        return other != null && dev == other.dev && ino == other.ino;
    }

    /** Whether the mode lets the file's group or others write it (format section 4: never read). */
    boolean unsafeMode() {
        return (mode & 0022) != 0;
    }

    /** The permission bits, 0-0777. */
    int perms() {
        return mode & 0777;
    }

    /** "a FIFO", "a directory", "a symbolic link", ...: what a name that is not a regular file holds. */
    String type() {
        return switch (mode & S_IFMT) {
            case S_IFREG -> "a regular file";
            case S_IFDIR -> "a directory";
            case S_IFLNK -> "a symbolic link";
            case S_IFIFO -> "a FIFO";
            case S_IFSOCK -> "a socket";
            case S_IFCHR -> "a character device";
            case S_IFBLK -> "a block device";
            default -> "a file of type " + Integer.toOctalString(mode & S_IFMT);
        };
    }
}
