package lock

import (
	"testing"
	"time"
)

// TestAcquireDelayJitter: the wait between attempts has jitter at the
// backoff's cap and when it is the busy holder's remaining TTL, so that the
// waiters of a crashed holder do not all try again in the same millisecond.
func TestAcquireDelayJitter(t *testing.T) {
	b := DefaultBackoff
	for _, c := range []struct {
		name string
		step time.Duration
		hint time.Duration
	}{
		{"at the cap", 10 * time.Second, 0},
		{"holder TTL", 10 * time.Second, 300 * time.Millisecond},
	} {
		seen := map[time.Duration]bool{}
		for range 50 {
			d := AcquireDelay(b, c.step, c.hint, 0)
			if d <= 0 || d > b.Cap {
				t.Fatalf("%s: delay %v outside (0, %v]", c.name, d, b.Cap)
			}
			if c.hint > 0 && d <= c.hint {
				t.Fatalf("%s: delay %v, want after the holder's TTL %v", c.name, d, c.hint)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Fatalf("%s: 50 waiters use %d distinct delays, want them spread", c.name, len(seen))
		}
	}
	// The heartbeat still bounds it.
	if d := AcquireDelay(b, 10*time.Second, 0, 100*time.Millisecond); d > 100*time.Millisecond {
		t.Fatalf("delay %v exceeds the heartbeat 100ms", d)
	}
}
