package io.shmcache;

/**
 * The segment layout, version 1: docs/segment-format.md is the contract; these are its
 * tables (word indices unless a name ends in OFF or BYTES). Offsets are derived from each
 * other as the document derives them.
 */
final class Layout {
    private Layout() {}

    static final long MAGIC = 0x31484341434D4853L; // b"SHMCACH1" as a little-endian int64, header word 0
    static final long LAYOUT_VERSION = 1;          // header word 1: the only layout this reader reads

    static final long PAGE = 4096;
    static final long WORD = 8;       // every shared word is a little-endian int64
    static final long ROW_WORDS = 8;  // a row is one 64-byte cache line

    static final int BUCKET_BITS = 13;
    static final long NBUCKETS = 1L << BUCKET_BITS; // 8192

    static final long MAX_WRITERS = 64;
    static final long MAX_WORKERS = 64;
    static final long MAX_PARTITIONS = 1024;

    static final long WRITERS_OFF = PAGE;
    static final long WORKERS_OFF = WRITERS_OFF + MAX_WRITERS * ROW_WORDS * WORD;
    static final long PARTITIONS_OFF = WORKERS_OFF + MAX_WORKERS * ROW_WORDS * WORD;
    static final long META_OFF = PARTITIONS_OFF + MAX_PARTITIONS * ROW_WORDS * WORD;
    static final long FIXED_BYTES = META_OFF + NBUCKETS * ROW_WORDS * WORD; // = index_off of every segment

    // header words
    static final int H_MAGIC = 0;
    static final int H_VERSION = 1;
    static final int H_KEY_SIZE = 2;
    static final int H_MAX_VALUE = 3;
    static final int H_NBUCKETS = 4;
    static final int H_SLOTS = 5;
    static final int H_RING = 6;
    static final int H_SIZE = 7;
    static final int H_CREATION_ID = 8;
    static final int H_TOPIC_LEN = 12;
    static final int H_PARTITIONS = 13;
    static final long TOPIC_MAX = 32 * WORD;
    static final long MAX_KEY_SIZE = 1024;
    static final long MIN_SLOTS = 8;

    // bucket meta row words
    static final int M_LOCK = 0;     // 0 free, else the owner word of the writer holding the bucket
    static final int M_VERSION = 1;  // seqlock: odd while a writer changes the bucket
    static final int M_LIVE = 4;     // live entries (stats)

    static final int TAG_SHIFT = 48;            // tag = the top 16 bits of the hash
    static final int POS_BITS = 47;             // slot = tag << POS_BITS | (ring offset + 1)
    static final long POS_MASK = (1L << POS_BITS) - 1;
    static final long RECORD_ALIGN = 16;
    static final long RECORD_HEADER = 8 + 8;    // hash word + flags/length word
    static final long F_LIVE = 1;

    // the readers' companion, /dev/shm/.shmcache-NAME.readers (section 13)
    static final long COMPANION_MAGIC = 0x31524452434D4853L; // b"SHMCRDR1"
    static final int COMPANION_CREATION = 2;                 // header word: the cache's creation id
    static final long MAX_READERS = 1024;
    static final long COMPANION_BYTES = PAGE + MAX_READERS * ROW_WORDS * WORD;
    static final int R_OWNER = 0;
    static final int R_HITS = 1;
    static final int R_MISSES = 2;
    static final int R_BATCHES = 3;
    static final int R_RETRIES = 4;
    static final int R_CORRUPTIONS = 5;

    // the reader's bounds (section 7; Python: engine/reader.py)
    static final int SPIN_LIMIT = 2000;
    static final long STUCK_GIVE_UP_NS = 1_000_000_000L;
    /** How often a handle attached by name looks for a re-created cache there. */
    static final long FOLLOW_INTERVAL_NS = 100_000_000L;

    static final String SHM_DIR = "/dev/shm";

    static long align(long n, long a) {
        return (n + a - 1) / a * a;
    }

    /** Ring bytes a record of this key size and value length takes. */
    static long recordSize(long keySize, long valueLen) {
        return align(RECORD_HEADER + keySize + valueLen, RECORD_ALIGN);
    }
}
