//go:build !unix

package bootstrap

import "time"

// processCPU is zero where getrusage is not there: the benchmarks then
// report no CPU per op.
func processCPU() time.Duration { return 0 }
