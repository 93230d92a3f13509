package zktest

import (
	"errors"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/faketime"
)

// FaketimeHint says how to get libfaketime, which fakes a server's clock.
const FaketimeHint = faketime.Hint

// Option changes how an ensemble is launched.
type Option func(*options)

type options struct {
	offsets map[int]time.Duration
}

// WithClockOffset starts server id (1..n) with its wall clock d ahead of the
// machine's (behind for a negative d), through libfaketime preloaded into
// its JVM. Only the wall clock is faked: ZooKeeper's timeouts (sessions,
// elections) run on the monotonic clock and keep real time, while the times
// it writes into nodes (mtime, ctime) when the server leads are off by d,
// as on a server whose clock is not synchronized.
func WithClockOffset(id int, d time.Duration) Option {
	return func(o *options) {
		if o.offsets == nil {
			o.offsets = map[int]time.Duration{}
		}
		o.offsets[id] = d
	}
}

// FaketimeLib returns the path of libfaketime, or an error that says how to
// install it.
func FaketimeLib() (string, error) { return faketime.Lib() }

// RequireFaketime skips t when libfaketime is missing, or fails it when
// LOCKWARDEN_REQUIRE_SERVERS is set.
func RequireFaketime(t testing.TB) {
	t.Helper()
	faketime.Require(t)
}

// clockEnv is the environment that sets a process's wall clock d off.
func clockEnv(d time.Duration) ([]string, error) {
	lib, err := FaketimeLib()
	if err != nil {
		return nil, err
	}
	if d == 0 {
		return nil, errors.New("a clock offset of 0: leave the option out")
	}
	return []string{
		"LD_PRELOAD=" + lib,
		// A relative offset in seconds, applied to the real clock (so the
		// faked clock runs at the real rate).
		"FAKETIME=" + faketime.Offset(d),
		// The monotonic clock stays real: the JVM's timed waits and
		// ZooKeeper's timeouts use it.
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
		// Read FAKETIME once, not from a cache file shared with others.
		"FAKETIME_NO_CACHE=1",
	}, nil
}
