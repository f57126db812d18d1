//go:build unix

package leaseapi_test

import (
	"syscall"
	"time"
)

// processCPU is the user+system CPU time this process has used, so a
// benchmark can report CPU per operation, which a busy machine skews less
// than wall-clock throughput.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
