package controllers

import (
	"strings"
	"sync"
	"time"
)

// Wake-ups are shared by every backend: a tenant's store that publishes
// release notifications in a loop (for keys of its own locks, each of which
// costs a List of the cache and an Inspect of that store) must not take the
// wake workers of the others. wakeGate bounds what one backend gets:
//   - at most wakeShare of the wake workers at once (a slow store holds
//     only those), for every backend;
//   - at most tenantWakeRate wake-ups a second (burst tenantWakeBurst) for
//     a backend a namespace chose (inline endpoints, a LockBackend). A
//     ClusterLockBackend is the administrators' and is not rate-limited:
//     a busy shared store hands over as fast as it releases.
//
// A wake-up over either bound waits its turn in the queue, where it is
// coalesced with the later releases of its key. Liveness never rests on it:
// every waiting Job still tries the store at its periodic requeue.
const (
	wakeShare       = wakeWorkers / 2
	tenantWakeRate  = 50
	tenantWakeBurst = 100
	// wakeRetry is how soon a wake-up that found its backend's share taken
	// is tried again.
	wakeRetry = 50 * time.Millisecond
)

type wakeGate struct {
	mu       sync.Mutex
	inFlight map[string]int
	limits   *keyedLimiter
}

func newWakeGate() *wakeGate {
	return &wakeGate{inFlight: map[string]int{}, limits: newKeyedLimiter(tenantWakeRate, tenantWakeBurst)}
}

// tenantBackend reports whether the backend ID names a backend that a
// namespace chose: anything but a ClusterLockBackend.
func tenantBackend(backendID string) bool {
	return !strings.HasPrefix(backendID, clusterBackendIDPrefix)
}

// enter admits a wake-up of backendID at now. When admitted, leave must be
// called once it is done; otherwise retry says when to try again.
func (g *wakeGate) enter(backendID string, now time.Time) (leave func(), retry time.Duration, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight[backendID] >= wakeShare {
		return nil, wakeRetry, false
	}
	if tenantBackend(backendID) && !g.limits.allow(backendID, now) {
		return nil, time.Second / tenantWakeRate, false
	}
	g.inFlight[backendID]++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.inFlight[backendID]--; g.inFlight[backendID] <= 0 {
				delete(g.inFlight, backendID)
			}
		})
	}, 0, true
}

// size returns how many backends the gate keeps state for.
func (g *wakeGate) size() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return max(g.limits.size(), len(g.inFlight))
}
