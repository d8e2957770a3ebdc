//go:build race

package txmeta

// raceEnabled: under the race detector sync.Pool drops a share of what is put back on
// purpose, so a single lookup's pooled batch is sometimes made anew; allocation counts are
// not checked then.
const raceEnabled = true
