package manager

import (
	"log/slog"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr"
)

// MemoryLimitRatio is the share of the container's memory limit given to
// the Go runtime as its soft limit (GOMEMLIMIT): the collector works harder
// as the heap nears it, instead of the kernel killing the container at the
// limit; the rest covers stacks, buffers outside the heap and the binary.
const MemoryLimitRatio = 0.9

// SetMemoryLimit sets the Go runtime's soft memory limit from the memory
// limit of the manager's cgroup (the container's resources.limits.memory),
// unless GOMEMLIMIT is set (or AUTOMEMLIMIT=off). Without a cgroup limit
// the runtime keeps its default (no limit). It returns the limit set.
func SetMemoryLimit(log logr.Logger, opts ...memlimit.Option) (int64, error) {
	opts = append([]memlimit.Option{
		memlimit.WithRatio(MemoryLimitRatio),
		memlimit.WithLogger(slog.New(logr.ToSlogHandler(log))),
	}, opts...)
	return memlimit.Set(opts...)
}
