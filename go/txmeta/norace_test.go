//go:build !race

package txmeta

const raceEnabled = false
