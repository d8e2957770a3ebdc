package shmcache

import (
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// Every constant of docs/segment-format.md's tables that this package uses is the
// document's (the Python side checks the same tables against engine/layout.py).
var docConstants = map[string]int64{
	"MAGIC": Magic, "LAYOUT_VERSION": LayoutVersion, "PAGE": page, "WORD": word, "ROW_WORDS": rowWords,
	"BUCKET_BITS": bucketBits, "NBUCKETS": NBuckets, "MAX_WRITERS": maxWriters, "MAX_WORKERS": maxWorkers,
	"MAX_PARTITIONS": maxPartitions, "FIXED_BYTES": fixedBytes, "H_MAGIC": hMagic, "H_VERSION": hVersion,
	"H_KEY_SIZE": hKeySize, "H_MAX_VALUE": hMaxValue, "H_NBUCKETS": hNBuckets, "H_SLOTS": hSlots, "H_RING": hRing,
	"H_SIZE": hSize, "H_CREATION_ID": hCreationID, "H_CREATED_NS": hCreatedNS, "MAX_KEY_SIZE": maxKeySize,
	"MIN_SLOTS": minSlots, "M_LOCK": mLock, "M_VERSION": mVersion, "M_HEAD": mHead, "M_TAIL": mTail,
	"M_LIVE": mLive, "M_LIVE_BYTES": mLiveBytes, "M_EVICTIONS": mEvictions, "M_TAKEOVERS": mTakeovers,
	"TAG_SHIFT": tagShift, "POS_BITS": posBits, "POS_MASK": posMask, "MAX_LOAD_NUM": maxLoadNum,
	"MAX_LOAD_DEN": maxLoadDen, "RECORD_ALIGN": recordAlign, "RECORD_HEADER": recordHead, "F_LIVE": fLive,
	"F_DEAD": fDead, "F_PAD": fPad, "H_SUPERVISOR": hSupervisor, "H_PARTITIONS": hPartitions,
	"H_TOPIC_LEN": hTopicLen, "H_TOPIC": hTopic, "TOPIC_MAX": topicMax, "H_SUPERVISOR_HEARTBEAT": hSupervisorHeartbeat,
	"H_AGE_CLOCK": hAgeClock, "AGE_CLOCK_WALL": ageClockWall, "AGE_CLOCK_MONOTONIC": ageClockMonotonic,
	"H_REBALANCES": hRebalances, "H_ASSIGNING": hAssigning, "H_ACCEPT_GAPS": hAcceptGaps,
	"H_WORKER_STALE_NS": hWorkerStaleNS, "H_BROKER_STATE": hBrokerState, "BROKER_WAITING": brokerWaiting,
	"H_WORKER_HANDLES": hWorkerHandles, "H_GAP_BITS": hGapBits, "P_APPLIED": pApplied,
	"P_HIGH_WATERMARK": pHighWater, "P_OWNER": pOwner, "P_CAUGHT_UP": pCaughtUp, "P_ASSIGNED": pAssigned,
	"K_OWNER": kOwner, "K_HEARTBEAT": kHeartbeat, "K_STARTS": kStarts, "K_ADDS": kAdds, "K_DELETES": kDeletes,
	"K_MALFORMED": kMalformed, "K_UNKNOWN": kUnknown, "K_MESSAGES": kMessages, "W_OWNER": wOwner, "W_WAIT": wWait,
	"W_SETS": wSets, "W_DELETES": wDeletes, "W_CORRUPTIONS": wCorruptions, "reader.SPIN_LIMIT": SpinLimit,
	"reader_stats.MAGIC": companionMagic, "reader_stats.VERSION": companionVersion,
	"reader_stats.H_CREATION_ID": companionCreation, "reader_stats.MAX_READERS": maxReaders,
	"reader_stats.R_OWNER": rOwner, "reader_stats.R_HITS": rHits, "reader_stats.R_MISSES": rMisses,
	"reader_stats.R_BATCHES": rBatches, "reader_stats.R_RETRIES": rRetries, "reader_stats.R_CORRUPTIONS": rCorruptions,
	"H_BROKER_SINCE": hBrokerSince, "BROKER_UNKNOWN": brokerUnknown, "BROKER_UP": brokerUp,
	"H_GROUP_MEMBERS": hGroupMembers, "H_GROUP_CHECKED": hGroupChecked, "H_GROUP_TEXT_LEN": hGroupTextLen,
	"H_GROUP_TEXT": hGroupText, "GROUP_TEXT_MAX": groupTextMax, "H_LOOKUP_FAILING_SINCE": hLookupFailingSince,
	"H_LOOKUP_TEXT_LEN": hLookupTextLen, "H_LOOKUP_TEXT": hLookupText, "LOOKUP_TEXT_MAX": lookupTextMax,
	"H_ELSEWHERE": hElsewhere, "H_GAP_OFFSETS": hGapOffsets, "P_LATEST": pLatest, "H_OWNER_LOCKS": hOwnerLocks,
	"reader_stats.LOCKS_SINCE": companionLocks, "H_PARTITION_TIMES": hPartitionTimes, "P_APPLIED_TIME": pAppliedTime,
}

// The tables' lists of names, in order.
var docLists = map[string][]string{"WORKER_STATES": workerStates}

// The document's constants this reader has no use for (none now): each with why not.
var unused = map[string]bool{}

func keys[V any](m map[string]V) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}

var docFloats = map[string]float64{
	"reader.STUCK_GIVE_UP": StuckGiveUpNS / 1e9, "control_status.STALE_HEARTBEAT_S": staleHeartbeatS,
}

func TestLayoutIsTheDocuments(t *testing.T) {
	raw, err := os.ReadFile("../docs/segment-format.md")
	if err != nil {
		t.Fatal(err)
	}
	// a constant is upper case (a module prefix aside); the rows of section 14's table of
	// reasons are lower-case words, not constants
	rows := regexp.MustCompile("(?m)^\\| `((?:[a-z_]+\\.)?[A-Z][A-Z0-9_]*)` \\| ([^|]+?) \\|").FindAllStringSubmatch(
		string(raw), -1)
	seen := map[string]bool{}
	for _, r := range rows {
		name, text := r[1], r[2]
		if w, ok := docConstants[name]; ok {
			got, err := strconv.ParseInt(text, 0, 64)
			if err != nil || got != w {
				t.Errorf("the document gives %s = %s; this package has %d", name, text, w)
			}
			seen[name] = true
		} else if w, ok := docFloats[name]; ok {
			got, err := strconv.ParseFloat(text, 64)
			if err != nil || got != w {
				t.Errorf("the document gives %s = %s; this package has %v", name, text, w)
			}
			seen[name] = true
		} else if w, ok := docLists[name]; ok {
			if got := strings.Split(strings.Trim(text, "`"), ", "); !reflect.DeepEqual(got, w) {
				t.Errorf("the document gives %s = %q; this package has %q", name, got, w)
			}
			seen[name] = true
		} else if !unused[name] {
			t.Errorf("the document's %s (%s) is not this package's: use it, or say in unused why not", name, text)
		}
	}
	for _, m := range []map[string]bool{keys(docConstants), keys(docFloats), keys(docLists)} {
		for name := range m {
			if !seen[name] {
				t.Errorf("%s is not in a table of the document", name)
			}
		}
	}
	if want := int64(77824); metaOff != want {
		t.Errorf("meta_off %d, the document says %d", metaOff, want)
	}
}
