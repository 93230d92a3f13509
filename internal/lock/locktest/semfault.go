package locktest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// The semaphore fault test (RunFaults with Faults.Limit > 1) records, for
// every lease, its acquisition (the Acquire call, returning the fencing
// token) and its stretches of validity on the client (see checkExclusion):
// from the grant's return to the Release call, or to the lease's Expires
// (after the last successful renewal) when that is earlier, as when the
// holder stalls. It checks that
//   - an acquisition that starts after another one has returned gets a
//     strictly larger fencing token (across every holder of the key), with
//     porcupine;
//   - at no instant more than Limit leases are within their validity.

type semInput struct{}

type semOutput struct{ fence int64 }

// tokenModel accepts a history of acquisitions whose tokens are
// linearizable: each one larger than every token granted before it.
var tokenModel = porcupine.Model{
	Init: func() any { return int64(0) },
	Step: func(state, _, output any) (bool, any) {
		issued, fence := state.(int64), output.(semOutput).fence
		if fence <= issued {
			return false, issued
		}
		return true, fence
	},
	DescribeOperation: func(_, output any) string {
		return fmt.Sprintf("acquire -> fence %d", output.(semOutput).fence)
	},
	DescribeState: func(state any) string { return fmt.Sprintf("issued=%d", state.(int64)) },
}

type semFaultStats struct {
	acquired, expired, stretches int64
	// replaced counts ErrReplaced answers (Faults.Policies).
	replaced int64
	peak     int // most slots taken by leases within their validity at once
	// heavy counts the leases granted with a weight above 1 (Faults.Weights).
	heavy int64
}

func semFaultRun(t *testing.T, seed uint64, f Faults) (semFaultStats, error) {
	f = f.withDefaults(t, f.Limit+2)
	ttl := f.TTL
	key := fmt.Sprintf("semaphore-%d", seed)
	h := &history{start: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), f.Duration)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		expired  int64
		replaced int64
		heavy    atomic.Int64
		valid    = &validityLog{}
	)
	injectFaults(ctx, &wg, f, seed)
	for c := range f.Clients {
		l := f.NewLocker(t)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(c+1))) //nolint:gosec // G404: a seeded, replayable test schedule, not a secret
			for ctx.Err() == nil {
				call := h.now()
				actx, acancel := context.WithTimeout(ctx, f.AcquireTimeout)
				req := lock.Request{Keys: []string{key}, TTL: ttl, Holder: fmt.Sprintf("client-%d", c), Queue: rng.IntN(2) == 0, Limit: f.Limit}
				if f.Weights && rng.IntN(3) == 0 {
					req.Weight = 2 + rng.IntN(f.Limit-1)
				}
				lease, err := l.Acquire(actx, policyRequest(req, f, rng))
				acancel()
				if errors.Is(err, lock.ErrReplaced) {
					mu.Lock()
					replaced++
					mu.Unlock()
				}
				if err != nil {
					continue
				}
				v := h.granted(valid, c, lease)
				if lease.Weight > 1 {
					heavy.Add(1)
				}
				h.add(c, semInput{}, call, semOutput{fence: lease.Fence})
				stalled := false
				for range 1 + rng.IntN(3) {
					switch p := rng.Float64(); {
					case p < 0.2:
						// Stall past the lease's end without renewing, like a long GC pause.
						time.Sleep(time.Until(lease.Expires) + ttl/2)
						stalled = true
					case p < 0.5:
						call := h.now()
						if renewed, err := l.Renew(ctx, lease, ttl); err == nil {
							lease = renewed
							v.renewed(call, lease)
						}
					default:
						time.Sleep(time.Duration(rng.Int64N(int64(ttl / 3))))
					}
					if stalled {
						break
					}
				}
				v.ended()
				if stalled {
					mu.Lock()
					expired++
					mu.Unlock()
				}
				rctx, rcancel := context.WithTimeout(context.Background(), f.AcquireTimeout)
				_ = l.Release(rctx, lease)
				rcancel()
			}
		})
	}
	wg.Wait()

	stretches := valid.all()
	st := semFaultStats{acquired: int64(len(h.ops)), expired: expired, replaced: replaced, heavy: heavy.Load(), peak: peakOverlap(stretches), stretches: int64(checkedStretches(stretches, f))}
	res, info := porcupine.CheckOperationsVerbose(tokenModel, h.ops, 30*time.Second)
	if res != porcupine.Ok {
		path := filepath.Join(t.TempDir(), "history.html")
		if os.Getenv("LOCKWARDEN_FAULT_VISUALIZE") != "" {
			path = fmt.Sprintf("fault-%d.html", seed)
		}
		if err := porcupine.VisualizePath(tokenModel, info, path); err == nil {
			t.Logf("history visualization: %s (set LOCKWARDEN_FAULT_VISUALIZE=1 to keep it)", path)
		}
		for _, op := range h.ops {
			t.Logf("client %d [%d, %d] %s", op.ClientId, op.Call, op.Return, tokenModel.DescribeOperation(op.Input, op.Output))
		}
		return st, fmt.Errorf("history of %d acquisitions is %s: a fencing token went backwards", len(h.ops), res)
	}
	if !f.EmptyRestarts {
		if err := checkExclusion(stretches, f.Limit); err != nil {
			return st, err
		}
	}
	t.Logf("%d acquisitions, %d ran out in a stall, at most %d of %d slots valid at once, %d stretches of validity checked for exclusion", st.acquired, st.expired, st.peak, f.Limit, st.stretches)
	return st, nil
}

// peakOverlap is the largest weight of the stretches that contain one
// instant.
func peakOverlap(vs []validity) int {
	type ev struct {
		t int64
		d int
	}
	evs := make([]ev, 0, 2*len(vs))
	for _, v := range vs {
		evs = append(evs, ev{v.from, v.slots()}, ev{v.to, -v.slots()})
	}
	// At equal instants a leave comes first: the stretches are open at their end.
	slices.SortFunc(evs, func(a, b ev) int {
		if c := cmp.Compare(a.t, b.t); c != 0 {
			return c
		}
		return cmp.Compare(a.d, b.d)
	})
	cur, peak := 0, 0
	for _, e := range evs {
		cur += e.d
		peak = max(peak, cur)
	}
	return peak
}
