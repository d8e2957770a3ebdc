package shmcache

// The segment layout, version 1: docs/segment-format.md is the contract, these are its
// tables (layout_test.go checks every constant the document's tables give against these).

const (
	Magic         = 0x31484341434D4853 // b"SHMCACH1" read as a little-endian int64, header word 0
	LayoutVersion = 1                  // header word 1: the only layout this package reads

	page     = 4096
	word     = 8 // every shared word is a little-endian int64
	rowWords = 8 // a row is one 64-byte cache line

	bucketBits = 13
	NBuckets   = 1 << bucketBits // 8192

	maxWriters    = 64
	maxWorkers    = 64
	maxPartitions = 1024

	writersOff    = page
	workersOff    = writersOff + maxWriters*rowWords*word
	partitionsOff = workersOff + maxWorkers*rowWords*word
	metaOff       = partitionsOff + maxPartitions*rowWords*word
	fixedBytes    = metaOff + NBuckets*rowWords*word // = index_off in every segment
)

// Header words (word indices).
const (
	hMagic               = 0
	hVersion             = 1
	hKeySize             = 2
	hMaxValue            = 3
	hNBuckets            = 4
	hSlots               = 5
	hRing                = 6
	hSize                = 7
	hCreationID          = 8
	hCreatedNS           = 9
	hSupervisor          = 10
	hOwnerLocks          = 11 // 1: every owner of the segment holds its word's owner lock (section 13)
	hTopicLen            = 12
	hPartitions          = 13
	hSupervisorHeartbeat = 14
	hAgeClock            = 15
	hTopic               = 16
	hRebalances          = 50
	hAssigning           = 54
	hAcceptGaps          = 57
	hWorkerStaleNS       = 58
	hPartitionTimes      = 63
	hBrokerState         = 60
	hBrokerSince         = 61
	hGroupMembers        = 96
	hGroupChecked        = 97 // unix ns of the supervisor's last look at the group; 0 none, -1 being written
	hGroupTextLen        = 99
	hLookupFailingSince  = 100 // on the age clock; 0 none, -1 being written
	hLookupTextLen       = 101
	hLookupText          = 104
	hGroupText           = 128
	hWorkerHandles       = 192
	hElsewhere           = 256 // a byte per partition: i + 1 if the i-th other member holds it
	hGapOffsets          = 410
	hGapBits             = 448

	topicMax          = 32 * word
	lookupTextMax     = 24 * word
	groupTextMax      = 64 * word
	maxKeySize        = 1024
	minSlots          = 8
	ageClockWall      = 0
	ageClockMonotonic = 1
	brokerUnknown     = 0
	brokerUp          = 1
	brokerWaiting     = 2
)

// workerStates are the states of H_WORKER_HANDLES' bits 0-7 (index + 1; 0 none published).
var workerStates = []string{"stopped", "starting", "up", "stopping", "backing-off"}

// Bucket meta row words.
const (
	mLock       = 0 // 0 free, else the owner word of the writer holding the bucket
	mVersion    = 1 // seqlock: odd while a writer changes the bucket
	mHead       = 2
	mTail       = 3
	mLive       = 4
	mLiveBytes  = 5
	mEvictions  = 6
	mTakeovers  = 7
	tagShift    = 48 // tag = top 16 bits of the hash
	posBits     = 47 // slot = tag << posBits | (ring offset + 1)
	posMask     = 1<<posBits - 1
	maxLoadNum  = 3
	maxLoadDen  = 4
	recordAlign = 16
	recordHead  = 8 + 8 // hash word + flags/length word
	fLive       = 1
	fDead       = 2
	fPad        = 3
)

// Writer, worker and partition row words.
const (
	wOwner       = 0
	wSets        = 1
	wDeletes     = 2
	wWait        = 5
	wCorruptions = 7
	kOwner       = 0
	kHeartbeat   = 1
	kStarts      = 2
	kAdds        = 3
	kDeletes     = 4
	kMalformed   = 5
	kUnknown     = 6
	kMessages    = 7
	pApplied     = 0
	pHighWater   = 1
	pOwner       = 2
	pCaughtUp    = 3
	pAssigned    = 5
	pAppliedTime = 6
	pLatest      = 7
)

// The readers' companion, /dev/shm/.shmcache-NAME.readers.
const (
	companionMagic    = 0x31524452434D4853 // b"SHMCRDR1"
	companionVersion  = 3                  // versions 1 to 3 have the same rows
	companionLocks    = 3                  // from this version on, each row's owner holds its owner lock
	companionCreation = 2                  // header word: the cache's creation id
	maxReaders        = 1024
	rOwner            = 0
	rHits             = 1
	rMisses           = 2
	rBatches          = 3
	rRetries          = 4
	rCorruptions      = 5
	companionSize     = page + maxReaders*rowWords*word
)

// The reader's bounds (Python: engine/reader.py SPIN_LIMIT, STUCK_GIVE_UP; engine/control/status.py).
const (
	SpinLimit        = 2000          // loads of an odd or moving version before the lock holder is looked at
	StuckGiveUpNS    = 1_000_000_000 // a lookup call waits at most this long in all on stuck buckets
	staleHeartbeatS  = 10.0          // a live supervisor's heartbeat older than this: stale, not ready
	waitReadyPollNS  = 50_000_000
	followIntervalNS = 100_000_000 // a handle attached by name looks at the name this often while used
)

func align(n, a int64) int64 { return (n + a - 1) / a * a }

// recordSize is the ring bytes a record of a key and value takes.
func recordSize(keySize, valueLen int64) int64 {
	return align(recordHead+keySize+valueLen, recordAlign)
}
