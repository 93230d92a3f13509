package manager

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr/testr"
)

// The manager runs in a container limited to 512Mi by the chart: the Go
// runtime must know, or a heap that could be collected grows until the
// kernel kills the leader.
func TestMemoryLimitFollowsTheContainer(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	for _, k := range []string{"GOMEMLIMIT", "AUTOMEMLIMIT"} {
		t.Setenv(k, "") // restored after the test
		_ = os.Unsetenv(k)
	}

	got, err := SetMemoryLimit(testr.New(t), memlimit.WithProvider(memlimit.Limit(512<<20)))
	if err != nil {
		t.Fatal(err)
	}
	ratio := MemoryLimitRatio
	want := int64(float64(512<<20) * ratio)
	if got != want || debug.SetMemoryLimit(-1) != want {
		t.Errorf("with a 512 MiB container limit the runtime's limit is %d (returned %d); want %d", debug.SetMemoryLimit(-1), got, want)
	}

	// An administrator's GOMEMLIMIT wins.
	debug.SetMemoryLimit(prev)
	t.Setenv("GOMEMLIMIT", "300MiB")
	if _, err := SetMemoryLimit(testr.New(t), memlimit.WithProvider(memlimit.Limit(512<<20))); err != nil {
		t.Fatal(err)
	}
	if got := debug.SetMemoryLimit(-1); got != prev {
		t.Errorf("with GOMEMLIMIT set the manager changed the runtime's limit to %d; want it left alone", got)
	}
}
