package io.shmcache;

import static io.shmcache.Layout.*;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.BasicFileAttributes;
import java.nio.file.attribute.PosixFileAttributes;
import java.util.function.IntToLongFunction;

/**
 * One mapping of a cache's file, after every check of docs/segment-format.md section 4.
 * The geometry is read once, here, and never again: every bound a lookup uses is this
 * object's own copy, so a header changed under the mapping cannot move a read.
 */
final class Mapped {
    final Mapping map;
    final Object fileKey; // the file's identity (device, inode): a re-created cache is another file
    final long creationId;
    final int keySize;
    final long maxValue;
    final long slots;
    final long ring;
    final long ringOff;
    volatile boolean lost; // the file was cut short under the mapping (a fault was caught)

    private Mapped(Mapping map, Object fileKey, long[] geo) {
        this.map = map;
        this.fileKey = fileKey;
        this.keySize = (int) geo[0];
        this.maxValue = geo[1];
        this.slots = geo[2];
        this.ring = geo[3];
        this.ringOff = align(FIXED_BYTES + NBUCKETS * slots * WORD, PAGE);
        this.creationId = map.getLong(H_CREATION_ID * WORD);
    }

    /** What is at path now (no link followed): its identity and size; null if nothing is there. */
    static BasicFileAttributes at(Path path) {
        try {
            return Files.readAttributes(path, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
        } catch (IOException e) {
            return null;
        }
    }

    /** Opens, checks and maps the file at path (sections 1 and 4). */
    static Mapped open(String cache, Path path) {
        return open(cache, path, null);
    }

    /**
     * Opens, checks and maps the file at path (sections 1 and 4); with an owner, refuses
     * ({@link ShmcacheException.WrongOwner}) a file another user owns before it is opened,
     * and a file replaced at the path between that look and the open before a byte is read.
     */
    static Mapped open(String cache, Path path, Owner owner) {
        BasicFileAttributes a;
        try {
            a = owner == null ? Files.readAttributes(path, BasicFileAttributes.class, LinkOption.NOFOLLOW_LINKS)
                    : Files.readAttributes(path, PosixFileAttributes.class, LinkOption.NOFOLLOW_LINKS);
        } catch (NoSuchFileException e) {
            throw new ShmcacheException.NotFound(cache, "no such cache (" + path + ")");
        } catch (IOException e) {
            throw new ShmcacheException.NotACache(cache, "cannot look at " + path + ": " + e, e);
        }
        if (!a.isRegularFile()) { // a FIFO, a directory, a link: never opened, never followed
            throw new ShmcacheException.NotACache(cache, path + " is not a regular file, not a shmcache segment");
        }
        if (owner != null) {
            owner.check(cache, path, (PosixFileAttributes) a, "");
        }
        try (FileChannel ch = FileChannel.open(path, StandardOpenOption.READ, LinkOption.NOFOLLOW_LINKS)) {
            if (owner != null) { // the file opened is the one whose owner was looked at (Java has no fstat)
                BasicFileAttributes now = at(path);
                if (now == null || !a.fileKey().equals(now.fileKey())) {
                    throw new ShmcacheException.NotACache(cache, path + " was replaced while it was being opened, "
                            + "after its owner was checked (owner=" + owner + "): not read; attach again");
                }
            }
            long size = ch.size();
            ByteBuffer head = ByteBuffer.allocate((int) PAGE).order(ByteOrder.LITTLE_ENDIAN);
            while (head.hasRemaining() && ch.read(head, head.position()) > 0) {
                // the first page, read before anything is mapped
            }
            if (size < PAGE || head.hasRemaining()) {
                throw new ShmcacheException.NotACache(cache, path + " is " + size + " bytes, not a shmcache segment");
            }
            check(cache, path, size, i -> head.getLong(i * (int) WORD), head.getLong(0));
            Mapping m = Mapping.map(ch, size, false);
            long[] geo; // checked again on the mapping: the file may have changed since
            try {
                geo = check(cache, path, size, i -> m.getLong(i * WORD), m.getLongAcquire(H_MAGIC * WORD));
            } catch (InternalError e) {
                throw Mapped.cutShort(cache, path, e);
            }
            return new Mapped(m, a.fileKey(), geo);
        } catch (NoSuchFileException e) {
            throw new ShmcacheException.NotFound(cache, "no such cache (" + path + ")");
        } catch (IOException e) {
            throw new ShmcacheException.NotACache(cache, "cannot map " + path + ": " + e, e);
        }
    }

    static ShmcacheException.Corrupt cutShort(String cache, Path path, Throwable cause) {
        return new ShmcacheException.Corrupt(cache, null, path + " was cut short while this process mapped it "
                + "(truncated by a process that may write it); its content is gone from this handle: attach again, "
                + "or destroy and re-create the cache", cause);
    }

    /** The checks of section 4, in order: {key_size, max_value, slots, ring}, or the error naming the field. */
    static long[] check(String cache, Path path, long fileSize, IntToLongFunction h, long magic) {
        if (magic == 0) {
            throw new ShmcacheException.NotACache(cache, path + " has no shmcache magic (shmcache did not make it, or "
                    + "its header was overwritten): not a usable cache");
        }
        if (magic != MAGIC) {
            throw new ShmcacheException.NotACache(cache, path + " is not a shmcache segment (bad magic)");
        }
        long v = h.applyAsLong(H_VERSION);
        if (v != LAYOUT_VERSION) {
            throw new ShmcacheException.Version(cache, "has layout version " + v + "; this reader reads version "
                    + LAYOUT_VERSION);
        }
        long ks = h.applyAsLong(H_KEY_SIZE), maxv = h.applyAsLong(H_MAX_VALUE), slots = h.applyAsLong(H_SLOTS);
        long ring = h.applyAsLong(H_RING), size = h.applyAsLong(H_SIZE);
        if (h.applyAsLong(H_NBUCKETS) != NBUCKETS) {
            throw bad(cache, "nbuckets", h.applyAsLong(H_NBUCKETS), String.valueOf(NBUCKETS));
        }
        if (ks < 1 || ks > MAX_KEY_SIZE) {
            throw bad(cache, "key_size", ks, "from 1 to " + MAX_KEY_SIZE);
        }
        if (maxv < 0 || maxv > 0xFFFFFFFFL) {
            throw bad(cache, "max_value", maxv, "from 0 to 2**32-1");
        }
        if (slots < MIN_SLOTS || (slots & (slots - 1)) != 0 || slots > (1L << 46)) {
            throw bad(cache, "slots", slots, "a power of two from " + MIN_SLOTS + " to 2**46");
        }
        if (ring <= 0 || ring % RECORD_ALIGN != 0 || ring > POS_MASK) {
            throw bad(cache, "ring", ring, "a positive multiple of " + RECORD_ALIGN + " below 2**" + POS_BITS);
        }
        if (ring < recordSize(ks, maxv)) {
            throw bad(cache, "ring", ring, ">= " + recordSize(ks, maxv) + ", one record of key_size=" + ks
                    + " and max_value=" + maxv);
        }
        if (slots > fileSize || ring > fileSize) { // bounded by the file before they are multiplied
            throw bad(cache, "size", size, fileSize + ", the size of the file");
        }
        long derived = align(FIXED_BYTES + NBUCKETS * slots * WORD, PAGE) + NBUCKETS * ring;
        if (size != derived) {
            throw bad(cache, "size", size, derived + ", as derived from slots=" + slots + " and ring=" + ring);
        }
        if (size != fileSize) {
            throw bad(cache, "size", size, fileSize + ", the size of the file");
        }
        long topicLen = h.applyAsLong(H_TOPIC_LEN), parts = h.applyAsLong(H_PARTITIONS);
        if (topicLen < 0 || topicLen > TOPIC_MAX) {
            throw bad(cache, "topic_len", topicLen, "from 0 to " + TOPIC_MAX);
        }
        if (parts < 0 || parts > MAX_PARTITIONS) {
            throw bad(cache, "partitions", parts, "from 0 to " + MAX_PARTITIONS);
        }
        return new long[] {ks, maxv, slots, ring};
    }

    private static ShmcacheException.Corrupt bad(String cache, String field, long is, String should) {
        return new ShmcacheException.Corrupt(cache, field, "header field " + field + " is " + is + "; it should be "
                + should + " (a damaged or foreign segment)", null);
    }

    long metaWord(long bucket, int w) {
        return META_OFF + (bucket * ROW_WORDS + w) * WORD;
    }

    /** Live entries: the sum of every bucket's M_LIVE. */
    long entries() {
        long n = 0;
        for (long b = 0; b < NBUCKETS; b++) {
            n += map.getLong(metaWord(b, M_LIVE));
        }
        return n;
    }
}
