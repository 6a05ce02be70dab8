package testenv

import (
	"syscall"
	"testing"
	"time"
)

// ReportCPU reports, as the metric cpu-ns/op, the CPU time this process
// used per operation of b since start (a CPUTime reading). On a shared
// machine, where the hypervisor takes a varying part of every second, it
// says more than the time per operation.
func ReportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64((CPUTime()-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// CPUTime returns the user and system CPU time this process has used.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
