package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// The fault test models the resource a lock protects as a fenced register: it
// remembers the highest fencing token it has seen and rejects a write with a
// lower one. A new holder first announces its token to the register (the
// pattern docs/safety.md recommends), so from then on every holder with an
// older token is shut out.
//
// The porcupine model checks the recorded history for these properties:
//   - an acquisition that starts after another one has returned gets a
//     strictly larger fencing token (the tokens are linearizable);
//   - the register accepts a write (or announcement) exactly when its token
//     is at least the highest accepted so far: no stale write is accepted;
//   - a read returns the last accepted value.

type regOp int

const (
	opAcquire regOp = iota // Acquire, then announce the token to the register
	opWrite
	opRead
)

type regInput struct {
	op    regOp
	fence int64 // opWrite: the writer's token
	value int   // opWrite: the value written
}

type regOutput struct {
	fence    int64 // opAcquire: the token granted; opRead: the register's token
	accepted bool  // opAcquire, opWrite: whether the register accepted it
	value    int   // opRead: the value read
}

type regState struct {
	issued  int64 // largest token granted by an acquisition linearized so far
	highest int64 // highest token the register accepted
	value   int
}

var fencedRegisterModel = porcupine.Model{
	Init: func() any { return regState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(regState), input.(regInput), output.(regOutput)
		switch in.op {
		case opAcquire:
			if out.fence <= s.issued || out.accepted != (out.fence >= s.highest) {
				return false, s
			}
			s.issued = out.fence
			if out.accepted {
				s.highest = out.fence
			}
			return true, s
		case opWrite:
			if out.accepted != (in.fence >= s.highest) {
				return false, s
			}
			if out.accepted {
				s.highest, s.value = in.fence, in.value
			}
			return true, s
		default:
			return out.value == s.value && out.fence == s.highest, s
		}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(regInput), output.(regOutput)
		switch in.op {
		case opAcquire:
			return fmt.Sprintf("acquire -> fence %d (announce accepted=%v)", out.fence, out.accepted)
		case opWrite:
			return fmt.Sprintf("write(%d, fence %d) -> accepted=%v", in.value, in.fence, out.accepted)
		default:
			return fmt.Sprintf("read -> %d (fence %d)", out.value, out.fence)
		}
	},
	DescribeState: func(state any) string {
		s := state.(regState)
		return fmt.Sprintf("issued=%d highest=%d value=%d", s.issued, s.highest, s.value)
	},
}

// fencedRegister is the protected resource.
type fencedRegister struct {
	mu      sync.Mutex
	highest int64
	value   int
}

func (r *fencedRegister) write(fence int64, value int, announce bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fence < r.highest {
		return false
	}
	r.highest = fence
	if !announce {
		r.value = value
	}
	return true
}

func (r *fencedRegister) read() (int, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.value, r.highest
}

// history records operations with times on one monotonic clock.
type history struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
}

func (h *history) now() int64 { return int64(time.Since(h.start)) }

func (h *history) add(client int, in regInput, call int64, out regOutput) {
	ret := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// TestFencedRegisterModelRejectsStaleHistories shows that the checker used
// by the fault test can fail: a token that goes backwards, or a stale write
// that was accepted, makes the history illegal.
func TestFencedRegisterModelRejectsStaleHistories(t *testing.T) {
	op := func(client int, call, ret int64, in regInput, out regOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: in, Output: out}
	}
	cases := map[string]struct {
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		"fenced handover": {want: porcupine.Ok, ops: []porcupine.Operation{
			op(0, 0, 1, regInput{op: opAcquire}, regOutput{fence: 10, accepted: true}),
			op(0, 2, 3, regInput{op: opWrite, fence: 10, value: 1}, regOutput{accepted: true}),
			op(1, 4, 5, regInput{op: opAcquire}, regOutput{fence: 20, accepted: true}),
			op(0, 6, 7, regInput{op: opWrite, fence: 10, value: 2}, regOutput{accepted: false}),
			op(1, 8, 9, regInput{op: opRead}, regOutput{value: 1, fence: 20}),
		}},
		"token goes backwards after a restart": {want: porcupine.Illegal, ops: []porcupine.Operation{
			op(0, 0, 1, regInput{op: opAcquire}, regOutput{fence: 20, accepted: true}),
			op(1, 2, 3, regInput{op: opAcquire}, regOutput{fence: 5, accepted: false}),
		}},
		"stale write accepted": {want: porcupine.Illegal, ops: []porcupine.Operation{
			op(0, 0, 1, regInput{op: opAcquire}, regOutput{fence: 10, accepted: true}),
			op(1, 2, 3, regInput{op: opAcquire}, regOutput{fence: 20, accepted: true}),
			op(0, 4, 5, regInput{op: opWrite, fence: 10, value: 2}, regOutput{accepted: true}),
		}},
	}
	for name, tc := range cases {
		if got := porcupine.CheckOperationsTimeout(fencedRegisterModel, tc.ops, 10*time.Second); got != tc.want {
			t.Errorf("%s: check = %s, want %s", name, got, tc.want)
		}
	}
}

// TestFaultsFencedRegister runs clients that acquire, stall past their TTL
// without renewing, and write to a fenced register, while nodes are killed,
// restarted empty and paused; porcupine then checks the history. Runs are
// seeded: a failure prints the seed, and LOCKWARDEN_FAULT_SEED=<seed> replays
// it (LOCKWARDEN_FAULT_RUNS=<n> runs more). The seed fixes the fault schedule
// and the clients' choices, not the goroutine interleaving.
func TestFaultsFencedRegister(t *testing.T) {
	base := rand.Uint64()
	runs := 8
	if s := os.Getenv("LOCKWARDEN_FAULT_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("LOCKWARDEN_FAULT_SEED=%q: %v", s, err)
		}
		base, runs = seed, 1
	}
	if s := os.Getenv("LOCKWARDEN_FAULT_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("LOCKWARDEN_FAULT_RUNS=%q: %v", s, err)
		}
		runs = n
	}
	redlock := redistest.StartN(t, 3)
	single := redistest.Start(t)
	var rejected, acquired atomic.Int64
	for i := range runs {
		seed := base + uint64(i)
		servers, mode := redlock, "redlock-3"
		if seed%2 == 1 {
			servers, mode = []*redistest.Server{single}, "standalone"
		}
		t.Run(fmt.Sprintf("%s/seed=%d", mode, seed), func(t *testing.T) {
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("replay with LOCKWARDEN_FAULT_SEED=%d", seed)
				}
			})
			a, r := faultRun(t, seed, servers)
			acquired.Add(a)
			rejected.Add(r)
		})
	}
	t.Logf("%d acquisitions, %d stale writes rejected", acquired.Load(), rejected.Load())
	if !t.Failed() && (acquired.Load() == 0 || rejected.Load() == 0) {
		t.Errorf("the runs made %d acquisitions and %d stale write attempts: the faults did not exercise fencing", acquired.Load(), rejected.Load())
	}
}

func faultRun(t *testing.T, seed uint64, servers []*redistest.Server) (acquired, rejected int64) {
	const (
		clients  = 4
		ttl      = 300 * time.Millisecond
		duration = 1500 * time.Millisecond
	)
	key := fmt.Sprintf("register-%d", seed)
	reg := &fencedRegister{}
	h := &history{start: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var values atomic.Int64
	var wg sync.WaitGroup

	// Chaos: one node at a time is killed and restarted empty, or paused.
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 0))
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(50+rng.IntN(150)) * time.Millisecond):
			}
			s := servers[rng.IntN(len(servers))]
			if rng.IntN(2) == 0 {
				s.Kill()
				time.Sleep(time.Duration(20+rng.IntN(100)) * time.Millisecond)
				s.Restart()
			} else {
				s.Pause()
				time.Sleep(time.Duration(50+rng.IntN(300)) * time.Millisecond)
				s.Resume()
			}
		}
	})

	for c := range clients {
		l := newTestLocker(t, Config{Addrs: addrs(servers)})
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(c+1)))
			for ctx.Err() == nil {
				call := h.now()
				actx, acancel := context.WithTimeout(ctx, time.Second)
				lease, err := l.Acquire(actx, lock.Request{Keys: []string{key}, TTL: ttl, Holder: fmt.Sprintf("client-%d", c), Queue: rng.IntN(2) == 0})
				acancel()
				if err != nil {
					continue
				}
				ok := reg.write(lease.Fence, 0, true)
				h.add(c, regInput{op: opAcquire}, call, regOutput{fence: lease.Fence, accepted: ok})
				for range 1 + rng.IntN(3) {
					switch p := rng.Float64(); {
					case p < 0.25:
						// Stall past the lease's end without renewing, like a
						// long GC pause, then write anyway.
						time.Sleep(time.Until(lease.Expires) + ttl/2)
					case p < 0.5:
						if renewed, err := l.Renew(ctx, lease, ttl); err == nil {
							lease = renewed
						}
					}
					v := int(values.Add(1))
					call := h.now()
					ok := reg.write(lease.Fence, v, false)
					h.add(c, regInput{op: opWrite, fence: lease.Fence, value: v}, call, regOutput{accepted: ok})
					if rng.IntN(5) == 0 {
						call := h.now()
						v, f := reg.read()
						h.add(c, regInput{op: opRead}, call, regOutput{value: v, fence: f})
					}
				}
				rctx, rcancel := l.cleanupContext(ctx)
				_ = l.Release(rctx, lease)
				rcancel()
			}
		})
	}
	wg.Wait()

	for _, op := range h.ops {
		in, out := op.Input.(regInput), op.Output.(regOutput)
		switch {
		case in.op == opAcquire:
			acquired++
		case in.op == opWrite && !out.accepted:
			rejected++
		}
	}
	res, info := porcupine.CheckOperationsVerbose(fencedRegisterModel, h.ops, 30*time.Second)
	if res != porcupine.Ok {
		path := filepath.Join(t.TempDir(), "history.html")
		if os.Getenv("LOCKWARDEN_FAULT_VISUALIZE") != "" {
			path = fmt.Sprintf("fault-%d.html", seed)
		}
		if err := porcupine.VisualizePath(fencedRegisterModel, info, path); err == nil {
			t.Logf("history visualization: %s (set LOCKWARDEN_FAULT_VISUALIZE=1 to keep it)", path)
		}
		for _, op := range h.ops {
			t.Logf("client %d [%d, %d] %s", op.ClientId, op.Call, op.Return, fencedRegisterModel.DescribeOperation(op.Input, op.Output))
		}
		t.Fatalf("history of %d operations is %s: a stale write was accepted or a fencing token went backwards", len(h.ops), res)
	}
	t.Logf("%d operations: %d acquisitions, %d stale writes rejected", len(h.ops), acquired, rejected)
	return acquired, rejected
}
