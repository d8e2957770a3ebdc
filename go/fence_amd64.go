package shmcache

// loadFence orders the loads before it ahead of the loads after it. x86-64 never
// reorders loads with other loads (TSO), and the Go compiler does not move loads across
// an atomic load, so on amd64 the seqlock's plain loads need no fence.
func loadFence(*int64) {}
