package io.shmcache;

import static io.shmcache.Layout.*;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.IntToLongFunction;

/**
 * One mapping of a cache's file, after every check of docs/segment-format.md section 4.
 * The geometry is read once, here, and never again: every bound a lookup uses is this
 * object's own copy, so a header changed under the mapping cannot move a read.
 *
 * <p>The file is opened by {@link FileOpener} (never blocking, never following a link, a
 * regular file only), checked on the lstat of the file opened (owner, mode, size), its
 * header read with a positional read before anything is mapped (a stranger's file at the
 * name costs one page read), then mapped read-only and never populated: Java maps without
 * {@code MAP_POPULATE}, so a sparse file planted at the name costs only the pages lookups
 * touch (format section 1). The channel stays open while the file is mapped: the owner
 * locks of its words are tested on it (format section 13).
 */
final class Mapped {
    final Mapping map;
    final FileStat stat;  // the file mapped: its identity (a re-created cache is another file)
    final long creationId;
    final int keySize;
    final long maxValue;
    final long slots;
    final long ring;
    final long ringOff;
    final FileChannel ch;     // the file, open while mapped
    final boolean locks;      // its owners hold owner locks (H_OWNER_LOCKS)
    volatile boolean lost;    // the file was cut short under the mapping: never read again
    /** Calls reading the mapping now (low bits), RETIRED once its handle dropped it, UNMAPPED once unmapped. */
    private final AtomicLong uses = new AtomicLong();
    private static final long RETIRED = 1L << 62, UNMAPPED = 1L << 61;

    private Mapped(Mapping map, FileStat stat, long[] geo, FileChannel ch) {
        this.map = map;
        this.stat = stat;
        this.ch = ch;
        this.locks = map.getLong(H_OWNER_LOCKS * WORD) == 1;
        this.keySize = (int) geo[0];
        this.maxValue = geo[1];
        this.slots = geo[2];
        this.ring = geo[3];
        this.ringOff = align(FIXED_BYTES + NBUCKETS * slots * WORD, PAGE);
        this.creationId = map.getLong(H_CREATION_ID * WORD);
    }

    /**
     * Opens, checks and maps the file at path (sections 1 and 4): not a regular file, under
     * a page, no or bad magic [not a cache]; another user's file with an owner named [wrong
     * owner]; a file its group or others may write [unsafe mode]; not ours to open
     * [permission]; a layout version this reader does not read [version]; a header word out
     * of its bounds [corrupt].
     */
    static Mapped open(String cache, Path path, Owner owner) {
        FileOpener.Opened o = FileOpener.INSTANCE.open(cache, path, false, "");
        FileChannel ch = o.channel();
        boolean kept = false;
        try {
            FileStat st = o.stat();
            if (owner != null) {
                owner.check(cache, path, st, "");
            }
            if (st.unsafeMode()) {
                throw new ShmcacheException.UnsafeMode(cache, path + " has mode " + String.format("%04o", st.perms())
                        + " (owner " + Users.text(st.uid()) + "): its group or others may write it, so anyone could have "
                        + "put its content there; no shmcache creator makes such a file: refusing to read it (destroy "
                        + "and re-create the cache, or chmod it back to 0600 or 0640)");
            }
            long size = ch.size();
            if (size < PAGE) {
                throw new ShmcacheException.NotACache(cache, path + " is " + size + " bytes, not a shmcache segment");
            }
            ByteBuffer head = ByteBuffer.allocate((int) PAGE).order(ByteOrder.LITTLE_ENDIAN);
            while (head.hasRemaining() && ch.read(head, head.position()) > 0) {
                // the first page, read before anything is mapped
            }
            if (head.hasRemaining()) { // shrunk since its size was read
                throw new ShmcacheException.NotACache(cache, path + " is " + head.position() + " bytes, not a shmcache "
                        + "segment");
            }
            check(cache, path, size, i -> head.getLong(i * (int) WORD), head.getLong(0));
            Mapping m = map(cache, path, ch, size);
            boolean ok = false;
            long[] geo; // checked again on the mapping: the file may have changed since
            try {
                geo = check(cache, path, size, i -> m.getLong(i * WORD), m.getLongAcquire(H_MAGIC * WORD));
                Mapped mapped = new Mapped(m, st, geo, ch);
                Faults.seal();
                ok = kept = true;
                return mapped;
            } catch (InternalError e) {
                if (!Faults.isFault(e)) {
                    throw e;
                }
                throw cutShort(cache, path, e);
            } finally {
                if (!ok) {
                    m.unmap(); // a file refused keeps nothing mapped
                }
            }
        } catch (IOException e) {
            throw new ShmcacheException.NotACache(cache, "cannot read " + path + ": " + e, e);
        } finally {
            if (!kept) {
                close(ch); // refused: nothing of it is kept
            }
        }
    }

    /**
     * The whole file, read-only: {@code size} bytes, as read a moment ago. A file cut short
     * since cannot be mapped that far (the JDK says "Channel not open for writing"): that is
     * {@link ShmcacheException.Corrupt} ("cut short"), as a file cut short under a mapping is.
     */
    static Mapping map(String cache, Path path, FileChannel ch, long size) throws IOException {
        try {
            return Mapping.map(ch, 0, size, false);
        } catch (IOException e) {
            long now;
            try {
                now = ch.size();
            } catch (IOException ignored) {
                throw e;
            }
            if (now < size) {
                throw cutShort(cache, path, e);
            }
            throw e;
        }
    }

    private static void close(FileChannel ch) {
        try {
            ch.close();
        } catch (IOException ignored) {
            // nothing more is read from it
        }
    }

    /** Whether the owner word {@code w} at header word {@code index} names a live process (format section 13). */
    boolean alive(long w, long index) {
        return Liveness.isAlive(w, ch, index, locks);
    }

    /** Whether the writer a bucket's lock names by its owner word {@code w} runs: a live writer row holds it. */
    boolean writerAlive(long w) {
        if (w == 0 || !locks || w == Liveness.mine()) {
            return alive(w, 0);
        }
        for (long r = 0; r < MAX_WRITERS; r++) {
            long at = WRITERS_OFF + (r * ROW_WORDS + W_OWNER) * WORD;
            if (map.getLongAcquire(at) == w && alive(w, at / WORD)) {
                return true;
            }
        }
        return false;
    }

    /**
     * A call starts reading the mapping: false if its handle has dropped it already (then
     * read what the handle holds now).
     */
    boolean enter() {
        long u;
        do {
            u = uses.get();
            if ((u & RETIRED) != 0) {
                return false;
            }
        } while (!uses.compareAndSet(u, u + 1));
        return true;
    }

    /** A call has done reading the mapping; the last one out of a dropped mapping unmaps it. */
    void exit() {
        if (uses.decrementAndGet() == RETIRED) {
            unmapNow();
        }
    }

    /**
     * Its handle drops the mapping (another file at the name, nothing there, a file cut
     * short, the handle closed): unmapped now, or by the last call still reading it.
     */
    void retire() {
        long prev = uses.getAndUpdate(u -> u | RETIRED);
        if ((prev & RETIRED) == 0 && prev == 0) {
            unmapNow();
        }
    }

    /** Whether the mapping is gone from the process (tests). */
    boolean unmapped() {
        return (uses.get() & UNMAPPED) != 0;
    }

    private void unmapNow() {
        if (uses.compareAndSet(RETIRED, RETIRED | UNMAPPED)) {
            map.unmap();
            close(ch);
        }
    }

    static ShmcacheException.Corrupt cutShort(String cache, Path path, Throwable cause) {
        if (cause instanceof Mapping.Unmappable u) {
            return new ShmcacheException.Corrupt(cache, null, path + ": " + u.getMessage(), u);
        }
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
        if (slots < MIN_SLOTS || (slots & (slots - 1)) != 0 || slots > (POS_MASK + 1) >>> 1) { // 2**46
            throw bad(cache, "slots", slots, "a power of two from " + MIN_SLOTS + " to 2**46");
        }
        if (ring <= 0 || ring % RECORD_ALIGN != 0 || ring > POS_MASK) {
            throw bad(cache, "ring", ring, "a positive multiple of " + RECORD_ALIGN + " below 2**" + POS_BITS);
        }
        if (ring < recordSize(ks, maxv)) {
            throw bad(cache, "ring", ring, ">= " + recordSize(ks, maxv) + ", one record of key_size=" + ks
                    + " and max_value=" + maxv);
        }
        // slots <= 2**46 and ring < 2**47: NBUCKETS * slots * WORD <= 2**62 and NBUCKETS * ring < 2**60,
        // so the derived size is under 2**63 and a wrong size is always reported as derived
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

    /** The sum of word w of every bucket's meta row. */
    long sumMeta(int w) {
        long n = 0;
        for (long b = 0; b < NBUCKETS; b++) {
            n += map.getLong(metaWord(b, w));
        }
        return n;
    }

    /** Header word i as it stands. */
    long header(int i) {
        return map.getLong(i * WORD);
    }
}
