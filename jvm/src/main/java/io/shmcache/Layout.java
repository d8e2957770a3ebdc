package io.shmcache;

import java.util.List;

/**
 * The segment layout, version 1: docs/segment-format.md is the contract; these are its
 * tables (word indices unless a name ends in OFF or BYTES), under the document's own names
 * ({@code reader_stats.MAGIC} is {@link ReaderStats#MAGIC}, {@code reader.SPIN_LIMIT}
 * {@link Reader#SPIN_LIMIT}, and so on). LayoutTest reads the document's tables and checks
 * every constant here against them. The offsets below the tables ({@code ..._OFF},
 * {@code ..._BYTES}, {@code ..._NS}) are derived from the tables as the document derives
 * them, never typed out.
 */
final class Layout {
    private Layout() {}

    // section 2: words and byte order
    static final long MAGIC = 0x31484341434D4853L; // b"SHMCACH1" as a little-endian int64, header word 0
    static final long LAYOUT_VERSION = 1;          // header word 1: the only layout this reader reads
    static final long PAGE = 4096;                 // every section starts on a page
    static final long WORD = 8;                    // every shared word is a little-endian int64
    static final long ROW_WORDS = 8;               // a row is one 64-byte cache line
    static final int BUCKET_BITS = 13;
    static final long NBUCKETS = 1L << BUCKET_BITS; // 8192

    // section 3: sections
    static final long MAX_WRITERS = 64;
    static final long MAX_WORKERS = 64;
    static final long MAX_PARTITIONS = 1024;

    // section 4: header words and the checks at attach
    static final int H_MAGIC = 0;
    static final int H_VERSION = 1;
    static final int H_KEY_SIZE = 2;
    static final int H_MAX_VALUE = 3;
    static final int H_NBUCKETS = 4;
    static final int H_SLOTS = 5;
    static final int H_RING = 6;
    static final int H_SIZE = 7;
    static final int H_CREATION_ID = 8;
    static final int H_CREATED_NS = 9;
    static final long MAX_KEY_SIZE = 1024;
    static final long MIN_SLOTS = 8;

    // section 6: a bucket's meta row
    static final int M_LOCK = 0;     // 0 free, else the owner word of the writer holding the bucket
    static final int M_VERSION = 1;  // seqlock: odd while a writer changes the bucket
    static final int M_LIVE = 4;     // live entries (stats)
    static final int M_LIVE_BYTES = 5;
    static final int M_EVICTIONS = 6;
    static final int M_TAKEOVERS = 7;

    // sections 8-10: hash, slots, records
    static final int TAG_SHIFT = 48;            // tag = the top 16 bits of the hash
    static final int POS_BITS = 47;             // slot = tag << POS_BITS | (ring offset + 1)
    static final long POS_MASK = (1L << POS_BITS) - 1;
    static final long MAX_LOAD_NUM = 3;         // a bucket holds at most slots * 3 / 4 live entries
    static final long MAX_LOAD_DEN = 4;
    static final long RECORD_ALIGN = 16;
    static final long RECORD_HEADER = 8 + 8;    // hash word + flags/length word
    static final long F_LIVE = 1;

    // section 14: the control area, header words
    static final int H_SUPERVISOR = 10;
    static final int H_OWNER_LOCKS = 11; // 1: every owner of the segment holds its word's owner lock (section 13)
    static final int H_TOPIC_LEN = 12;
    static final int H_PARTITIONS = 13;
    static final int H_SUPERVISOR_HEARTBEAT = 14;
    static final int H_AGE_CLOCK = 15;
    static final int H_TOPIC = 16;
    static final long TOPIC_MAX = 256;
    static final long AGE_CLOCK_WALL = 0;
    static final long AGE_CLOCK_MONOTONIC = 1;
    static final int H_REBALANCES = 50;
    static final int H_ASSIGNING = 54;
    static final int H_ACCEPT_GAPS = 57;
    static final int H_WORKER_STALE_NS = 58;
    static final int H_PARTITION_TIMES = 63;
    static final int H_BROKER_STATE = 60;
    static final int H_BROKER_SINCE = 61;
    static final long BROKER_UNKNOWN = 0;
    static final long BROKER_UP = 1;
    static final long BROKER_WAITING = 2;
    static final int H_GROUP_MEMBERS = 96;
    static final int H_GROUP_CHECKED = 97;
    static final int H_GROUP_TEXT_LEN = 99;
    static final int H_LOOKUP_FAILING_SINCE = 100;
    static final int H_LOOKUP_TEXT_LEN = 101;
    static final int H_LOOKUP_TEXT = 104;
    static final long LOOKUP_TEXT_MAX = 192;
    static final int H_GROUP_TEXT = 128;
    static final long GROUP_TEXT_MAX = 512;
    static final int H_WORKER_HANDLES = 192;
    static final List<String> WORKER_STATES = List.of("stopped", "starting", "up", "stopping", "backing-off");
    static final int H_ELSEWHERE = 256;         // a byte per partition
    static final int H_GAP_OFFSETS = 410;
    static final int H_GAP_BITS = 448;          // a bit per partition
    // section 14: a partition's row, a worker's row, a writer's row (and section 15's writer words)
    static final int P_APPLIED = 0;
    static final int P_HIGH_WATERMARK = 1;
    static final int P_OWNER = 2;
    static final int P_CAUGHT_UP = 3;
    static final int P_ASSIGNED = 5;
    static final int P_APPLIED_TIME = 6;
    static final int P_LATEST = 7;
    static final int K_OWNER = 0;
    static final int K_HEARTBEAT = 1;
    static final int K_STARTS = 2;
    static final int K_ADDS = 3;
    static final int K_DELETES = 4;
    static final int K_MALFORMED = 5;
    static final int K_UNKNOWN = 6;
    static final int K_MESSAGES = 7;
    static final int W_OWNER = 0;
    static final int W_SETS = 1;
    static final int W_DELETES = 2;
    static final int W_WAIT = 5;
    static final int W_CORRUPTIONS = 7;

    /** Section 13: the readers' companion, /dev/shm/.shmcache-NAME.readers (Python's engine/reader_stats.py). */
    static final class ReaderStats {
        private ReaderStats() {}

        static final long MAGIC = 0x31524452434D4853L; // b"SHMCRDR1", companion word 0
        static final long VERSION = 3;                 // companion word 1 (versions 1 to 3 have the same rows)
        static final long LOCKS_SINCE = 3;             // from this version on, each row's owner holds its owner lock
        static final int H_CREATION_ID = 2;            // companion word 2: the cache's creation id
        static final long MAX_READERS = 1024;
        static final int R_OWNER = 0;
        static final int R_HITS = 1;
        static final int R_MISSES = 2;
        static final int R_BATCHES = 3;
        static final int R_RETRIES = 4;
        static final int R_CORRUPTIONS = 5;
    }

    /** Section 7: the reader's bounds (Python's engine/reader.py). */
    static final class Reader {
        private Reader() {}

        static final int SPIN_LIMIT = 2000;        // loads of an odd or moving version before a bucket is stuck
        static final double STUCK_GIVE_UP = 1.0;   // seconds a call waits in all on stuck buckets
    }

    /** Section 14: readiness (Python's engine/control/status.py). */
    static final class ControlStatus {
        private ControlStatus() {}

        static final double STALE_HEARTBEAT_S = 10.0; // a live supervisor's heartbeat older than this: stale
    }

    // Derived from the tables (not in them)
    static final long WRITERS_OFF = PAGE;
    static final long WORKERS_OFF = WRITERS_OFF + MAX_WRITERS * ROW_WORDS * WORD;
    static final long PARTITIONS_OFF = WORKERS_OFF + MAX_WORKERS * ROW_WORDS * WORD;
    static final long META_OFF = PARTITIONS_OFF + MAX_PARTITIONS * ROW_WORDS * WORD;
    static final long FIXED_BYTES = META_OFF + NBUCKETS * ROW_WORDS * WORD; // = index_off of every segment
    static final long COMPANION_BYTES = PAGE + ReaderStats.MAX_READERS * ROW_WORDS * WORD;
    static final long STUCK_GIVE_UP_NS = (long) (Reader.STUCK_GIVE_UP * 1e9);
    /** How often, at least, a handle attached by name looks at what is at the name (section 1). */
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
