//go:build !unix

package leaseapi_test

import "time"

// processCPU is unavailable here; the benchmark then reports throughput only.
func processCPU() (time.Duration, bool) { return 0, false }
