package locktest

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// The semaphore fault test (RunFaults with Faults.Limit > 1) records, for
// every lease, an enter operation (the Acquire call, returning the fencing
// token) and a leave operation at the instant its validity certainly ended on
// the client: the Release call, or the lease's Expires (after the last
// successful renewal) when that is earlier, as when the holder stalls. The
// porcupine model checks that
//   - an acquisition that starts after another one has returned gets a
//     strictly larger fencing token (across every holder of the key);
//   - at no instant more than Limit leases are within their validity.

type semInput struct{ leave bool }

type semOutput struct{ fence int64 }

type semState struct {
	issued  int64 // largest token granted by an acquisition linearized so far
	holders int   // leases entered and not yet left
}

func semaphoreModel(limit int) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return semState{} },
		Step: func(state, input, output any) (bool, any) {
			s, in, out := state.(semState), input.(semInput), output.(semOutput)
			if in.leave {
				if s.holders == 0 {
					return false, s
				}
				s.holders--
				return true, s
			}
			if out.fence <= s.issued || s.holders >= limit {
				return false, s
			}
			s.issued, s.holders = out.fence, s.holders+1
			return true, s
		},
		DescribeOperation: func(input, output any) string {
			if input.(semInput).leave {
				return "leave (release or end of validity)"
			}
			return fmt.Sprintf("acquire -> fence %d", output.(semOutput).fence)
		},
		DescribeState: func(state any) string {
			s := state.(semState)
			return fmt.Sprintf("issued=%d holders=%d/%d", s.issued, s.holders, limit)
		},
	}
}

type semFaultStats struct {
	acquired, expired int64
	peak              int // most leases within their validity at once
}

func semFaultRun(t *testing.T, seed uint64, f Faults) semFaultStats {
	if f.Clients == 0 {
		f.Clients = f.Limit + 2
	}
	if f.TTL == 0 {
		f.TTL = 300 * time.Millisecond
	}
	if f.Duration == 0 {
		f.Duration = 1500 * time.Millisecond
	}
	if f.AcquireTimeout == 0 {
		f.AcquireTimeout = time.Second
	}
	if f.FaultGap == 0 {
		f.FaultGap = 200 * time.Millisecond
	}
	ttl := f.TTL
	key := fmt.Sprintf("semaphore-%d", seed)
	h := &history{start: time.Now()}
	at := func(tm time.Time) int64 { return int64(tm.Sub(h.start)) }
	ctx, cancel := context.WithTimeout(context.Background(), f.Duration)
	defer cancel()
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		expired   int64
		intervals [][2]int64
	)
	injectFaults(ctx, &wg, f, seed)
	for c := range f.Clients {
		l := f.NewLocker(t)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(c+1))) //nolint:gosec // G404: a seeded, replayable test schedule, not a secret
			for ctx.Err() == nil {
				call := h.now()
				actx, acancel := context.WithTimeout(ctx, f.AcquireTimeout)
				lease, err := l.Acquire(actx, lock.Request{Keys: []string{key}, TTL: ttl, Holder: fmt.Sprintf("client-%d", c), Queue: rng.IntN(2) == 0, Limit: f.Limit})
				acancel()
				if err != nil {
					continue
				}
				h.add(c, semInput{}, call, semOutput{fence: lease.Fence})
				entered := h.now()
				stalled := false
				for range 1 + rng.IntN(3) {
					switch p := rng.Float64(); {
					case p < 0.2:
						// Stall past the lease's end without renewing, like a long GC pause.
						time.Sleep(time.Until(lease.Expires) + ttl/2)
						stalled = true
					case p < 0.5:
						if renewed, err := l.Renew(ctx, lease, ttl); err == nil {
							lease = renewed
						}
					default:
						time.Sleep(time.Duration(rng.Int64N(int64(ttl / 3))))
					}
					if stalled {
						break
					}
				}
				left := min(h.now(), at(lease.Expires))
				left = max(left, entered+1)
				// The leave is an instant: the validity ended then, not later.
				h.addOp(c, semInput{leave: true}, left, semOutput{}, left)
				mu.Lock()
				intervals = append(intervals, [2]int64{entered, left})
				if stalled {
					expired++
				}
				mu.Unlock()
				rctx, rcancel := context.WithTimeout(context.Background(), f.AcquireTimeout)
				_ = l.Release(rctx, lease)
				rcancel()
			}
		})
	}
	wg.Wait()

	st := semFaultStats{acquired: int64(len(intervals)), expired: expired, peak: peakOverlap(intervals)}
	model := semaphoreModel(f.Limit)
	res, info := porcupine.CheckOperationsVerbose(model, h.ops, 30*time.Second)
	if res != porcupine.Ok {
		path := filepath.Join(t.TempDir(), "history.html")
		if os.Getenv("LOCKWARDEN_FAULT_VISUALIZE") != "" {
			path = fmt.Sprintf("fault-%d.html", seed)
		}
		if err := porcupine.VisualizePath(model, info, path); err == nil {
			t.Logf("history visualization: %s (set LOCKWARDEN_FAULT_VISUALIZE=1 to keep it)", path)
		}
		for _, op := range h.ops {
			t.Logf("client %d [%d, %d] %s", op.ClientId, op.Call, op.Return, model.DescribeOperation(op.Input, op.Output))
		}
		t.Fatalf("history of %d operations is %s: more than %d leases were valid at once or a fencing token went backwards", len(h.ops), res, f.Limit)
	}
	t.Logf("%d operations: %d acquisitions, %d ran out in a stall, at most %d of %d slots valid at once", len(h.ops), st.acquired, st.expired, st.peak, f.Limit)
	return st
}

// peakOverlap is the most intervals that contain one instant.
func peakOverlap(iv [][2]int64) int {
	type ev struct {
		t int64
		d int
	}
	evs := make([]ev, 0, 2*len(iv))
	for _, x := range iv {
		evs = append(evs, ev{x[0], 1}, ev{x[1], -1})
	}
	// At equal instants a leave comes first: the intervals are open at their end.
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
