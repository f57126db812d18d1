//go:build !linux

package relay

// park is Linux's (park_linux.go); elsewhere an idle direction waits on its
// goroutine, and spliceRelay never reports one idle.
func park(*direction) (uint64, bool) { return 0, false }

// unpark has nothing to take back where nothing parks.
func unpark(uint64) bool { return false }
