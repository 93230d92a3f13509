package locktest

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// The fault test (RunFaults) models the resource a lock protects as a fenced register: it
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

func (h *history) add(client int, in any, call int64, out any) {
	h.addOp(client, in, call, out, h.now())
}

// addOp records an operation called at call that returned at ret.
func (h *history) addOp(client int, in any, call int64, out any, ret int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// Faults configures one seeded fault run (see RunFaults).
type Faults struct {
	// NewLocker returns a new Locker on the backend under test; each client
	// gets its own, like separate processes.
	NewLocker func(t *testing.T) lock.Locker
	// Inject injects one fault chosen with rng (kill and restart a server,
	// pause one, partition one) and returns once it is healed. It is called
	// in a loop, with random pauses between faults, until ctx ends.
	Inject func(ctx context.Context, rng *rand.Rand)
	// Clients is how many clients compete for the key. Default 4.
	Clients int
	// TTL is the lease TTL the clients ask for. Default 300ms.
	TTL time.Duration
	// Duration is how long the clients and faults run. Default 1.5s.
	Duration time.Duration
	// AcquireTimeout bounds each Acquire. Default 1s.
	AcquireTimeout time.Duration
	// FaultGap is the longest random pause between two faults. Default 200ms.
	FaultGap time.Duration
	// Limit, above 1, makes the clients take slots of a counting semaphore
	// (lock.Request.Limit) instead of a mutex, and the history is checked
	// against the semaphore model instead of the fenced register: tokens
	// strictly increasing, and never more than Limit leases within their
	// validity at once (see semaphoreModel). Clients then defaults to Limit+2.
	// The count holds only while the backend keeps its state: restart
	// servers with persistence (or after the TTL), not empty.
	Limit int
	// EmptyRestarts says that Inject restarts servers without their data, so
	// that a store forgets the leases it granted: exclusion cannot hold then
	// and is not checked, only the fencing tokens and the register are (the
	// fence must not go backwards even when the store forgets). Default
	// false: every run checks exclusion (see checkExclusion).
	EmptyRestarts bool
	// Nemeses, when set, replace Inject: between two gaps the run injects
	// one of them, in a seeded order that brings each once before any
	// comes again, and the tally counts the faults by name: FaultTally.Check
	// fails when one of them was never injected.
	Nemeses []Nemesis
	// ListedFirst makes the first round inject Nemeses in the order listed,
	// later rounds in the seeded order. List a short nemesis before one that
	// may outlast the run (a session expiry, a quorum loss): with a seeded
	// first round the long one came first in every run of a series now and
	// then, and the short one was never injected.
	ListedFirst bool
	// Policies makes the clients also use the queue rules of contention
	// ReplaceQueued and CancelInProgress, and priority: a quarter of the
	// acquisitions ask with Request.Replace (a replaced waiter gives up);
	// half of a mutex's with Request.Preempt too (the holder's renewals
	// then fail with lock.ErrPreempted, and it writes on until its lease
	// expires, as a holder that is slow to stop does); half of the queued
	// ones with a Request.Boost of up to two TTLs (boosted waiters pass
	// others). Exclusion and the fencing tokens must hold as without them:
	// a preempted lease stays valid until its Expires, so no store may
	// hand its keys to another before then. FaultTally.Check then also
	// fails when no run replaced a waiter or preempted a lease.
	Policies bool
	// Weights, with Limit above 1, makes a third of the semaphore clients'
	// requests take 2 to Limit slots (Request.Weight): exclusion is then
	// checked on the weights held, never more than Limit at an instant.
	// For stores that take weighted requests.
	Weights bool

	record func(nemesis string) // set by RunFaults: counts a fault in the tally
}

// faultSeeds returns the first seed, the number of runs, and whether the
// seed was given (LOCKWARDEN_FAULT_SEED: one replayed run).
func faultSeeds(t *testing.T, runs int) (uint64, int, bool) {
	t.Helper()
	replay := false
	base := rand.Uint64() //nolint:gosec // G404: a seeded, replayable test schedule, not a secret
	if s := os.Getenv("LOCKWARDEN_FAULT_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("LOCKWARDEN_FAULT_SEED=%q: %v", s, err)
		}
		base, runs, replay = seed, 1, true
	}
	if s := os.Getenv("LOCKWARDEN_FAULT_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("LOCKWARDEN_FAULT_RUNS=%q: %v", s, err)
		}
		runs = n
	}
	return base, runs, replay
}

// Seeds yields the seeds of the fault runs: runs consecutive seeds from a
// random base (LOCKWARDEN_FAULT_RUNS=<n>: n of them), or the one seed in
// LOCKWARDEN_FAULT_SEED. After those it yields more, up to extraRunFactor
// times as many, while the runs so far have not exercised what Check
// requires: on a loaded machine the clients of a run may get few leases
// between the faults. The properties are checked in every run; a longer
// series only makes it likely that some run exercises them. A replayed seed
// is not followed by more.
func (c *FaultTally) Seeds(t *testing.T, runs int) iter.Seq[uint64] {
	t.Helper()
	base, runs, replay := faultSeeds(t, runs)
	limit := runs
	if !replay {
		limit = runs * extraRunFactor
	}
	return func(yield func(uint64) bool) {
		for i := range limit {
			if i >= runs && (c.exercised() || t.Failed()) {
				return
			}
			if !yield(base + uint64(i)) {
				return
			}
		}
	}
}

// extraRunFactor bounds Seeds: at most this many times the runs asked for.
const extraRunFactor = 3

// FaultTally counts what the fault runs exercised.
type FaultTally struct {
	acquired, rejected atomic.Int64
	// Faults.Policies runs: waiters replaced and renewals refused as
	// preempted.
	replaced, preempted atomic.Int64
	policies            atomic.Bool
	// Runs whose history was checked, and the stretches of validity their
	// exclusion checks covered.
	runs, stretches atomic.Int64
	mu              sync.Mutex
	faults          map[string]int64 // faults injected, by nemesis; 0 for one not injected yet
	// Semaphore runs (Faults.Limit > 1): leases that ran out while their
	// holder stalled, and runs in which Limit leases were valid at once.
	expired, full atomic.Int64
	semaphore     atomic.Bool
	// Faults.Weights runs: leases granted with a weight above 1.
	heavy   atomic.Int64
	weights atomic.Bool
}

// expect notes the nemeses a run may inject, so that Check can tell when
// one never was.
func (c *FaultTally) expect(nemeses []Nemesis) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.faults == nil {
		c.faults = map[string]int64{}
	}
	for _, n := range nemeses {
		c.faults[n.Name] += 0
	}
}

// missing returns the nemeses expected and never injected.
func (c *FaultTally) missing() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for n, count := range c.faults {
		if count == 0 {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// exercised tells whether the runs so far exercised what Check requires.
func (c *FaultTally) exercised() bool {
	if len(c.missing()) > 0 {
		return false
	}
	if c.policies.Load() && (c.replaced.Load() == 0 || (!c.semaphore.Load() && c.preempted.Load() == 0)) {
		return false
	}
	if c.semaphore.Load() {
		return c.acquired.Load() > 0 && c.expired.Load() > 0 && c.full.Load() > 0
	}
	return c.acquired.Load() > 0 && c.rejected.Load() > 0
}

// Check fails t when the runs never acquired or never had a stale write
// rejected: then the faults did not exercise fencing and the test proved
// nothing. For semaphore runs: when no lease ran out while its holder
// stalled, or no run ever had Limit leases valid at once. With
// Faults.Nemeses: also when one of them was never injected.
func (c *FaultTally) Check(t *testing.T) {
	t.Helper()
	t.Log(c.Table())
	if m := c.missing(); len(m) > 0 && !t.Failed() {
		t.Errorf("the runs never injected %s: the faults did not exercise every nemesis", strings.Join(m, ", "))
	}
	if c.policies.Load() {
		t.Logf("queue rules: %d waiters replaced, %d renewals refused as preempted", c.replaced.Load(), c.preempted.Load())
		if !t.Failed() && (c.replaced.Load() == 0 || (!c.semaphore.Load() && c.preempted.Load() == 0)) {
			t.Errorf("the runs replaced %d waiters and preempted %d leases: they did not exercise the queue rules", c.replaced.Load(), c.preempted.Load())
		}
	}
	if c.weights.Load() {
		t.Logf("weights: %d leases of more than one slot", c.heavy.Load())
		if !t.Failed() && c.heavy.Load() == 0 {
			t.Error("no lease of more than one slot was granted: the runs did not exercise weights")
		}
	}
	if c.semaphore.Load() {
		t.Logf("%d acquisitions, %d leases ran out in a stall, %d runs with every slot taken", c.acquired.Load(), c.expired.Load(), c.full.Load())
		if !t.Failed() && (c.acquired.Load() == 0 || c.expired.Load() == 0 || c.full.Load() == 0) {
			t.Errorf("the runs made %d acquisitions, %d leases ran out and %d runs filled every slot: the faults did not exercise the semaphore", c.acquired.Load(), c.expired.Load(), c.full.Load())
		}
		return
	}
	t.Logf("%d acquisitions, %d stale writes rejected", c.acquired.Load(), c.rejected.Load())
	if !t.Failed() && (c.acquired.Load() == 0 || c.rejected.Load() == 0) {
		t.Errorf("the runs made %d acquisitions and %d stale write attempts: the faults did not exercise fencing", c.acquired.Load(), c.rejected.Load())
	}
}

// record counts one fault of the named nemesis.
func (c *FaultTally) record(nemesis string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.faults == nil {
		c.faults = map[string]int64{}
	}
	c.faults[nemesis]++
}

// Table is the line of docs/safety.md's nemesis tables for the runs so far:
// the runs whose histories were checked, the stretches of validity checked
// for exclusion, the violations (none, or the test failed) and the faults
// injected by nemesis.
func (c *FaultTally) Table() string {
	c.mu.Lock()
	names := slices.Sorted(maps.Keys(c.faults))
	faults := make([]string, 0, len(names))
	for _, n := range names {
		faults = append(faults, fmt.Sprintf("%s %d", n, c.faults[n]))
	}
	c.mu.Unlock()
	if len(faults) == 0 {
		faults = append(faults, "not counted")
	}
	return fmt.Sprintf("nemesis table: %d runs, %d histories checked, %d stretches of validity checked for exclusion, 0 violations; faults: %s",
		c.runs.Load(), c.runs.Load(), c.stretches.Load(), strings.Join(faults, ", "))
}

// RunFaults runs one seeded fault run as a subtest named name/seed=<seed>:
// clients acquire a key, stall past their TTL without renewing, renew, and
// write to a fenced register, while f.Inject breaks the backend; porcupine
// then checks the history against the fenced-register model. A failure prints
// the seed; LOCKWARDEN_FAULT_SEED=<seed> replays it. The seed fixes the fault
// schedule and the clients' choices, not the goroutine interleaving.
func RunFaults(t *testing.T, name string, seed uint64, tally *FaultTally, f Faults) {
	t.Run(fmt.Sprintf("%s/seed=%d", name, seed), func(t *testing.T) {
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("replay with LOCKWARDEN_FAULT_SEED=%d", seed)
			}
		})
		if tally != nil {
			f.record = tally.record
			tally.expect(f.Nemeses)
			if f.Policies {
				tally.policies.Store(true)
			}
		}
		if f.Limit > 1 {
			st, err := semFaultRun(t, seed, f)
			if err != nil {
				t.Fatal(err)
			}
			if tally != nil {
				tally.runs.Add(1)
				tally.stretches.Add(st.stretches)
				tally.semaphore.Store(true)
				tally.acquired.Add(st.acquired)
				tally.expired.Add(st.expired)
				tally.replaced.Add(st.replaced)
				tally.heavy.Add(st.heavy)
				if f.Weights {
					tally.weights.Store(true)
				}
				if st.peak >= f.Limit {
					tally.full.Add(1)
				}
			}
			return
		}
		st, err := faultRun(t, seed, f)
		if err != nil {
			t.Fatal(err)
		}
		if tally != nil {
			tally.runs.Add(1)
			tally.stretches.Add(st.stretches)
			tally.acquired.Add(st.acquired)
			tally.rejected.Add(st.rejected)
			tally.replaced.Add(st.replaced)
			tally.preempted.Add(st.preempted)
		}
	})
}

// FindViolation is the negative control of the fault harness: it runs up
// to runs seeded fault runs of f (a mutant store's, or a setup known to be
// unsafe) and returns the first
// violation one of them found, or nil when every run passed. The runs are
// logged as RunFaults logs them, but a violation does not fail t.
func FindViolation(t *testing.T, runs int, f Faults) error {
	t.Helper()
	// LOCKWARDEN_FAULT_SEED replays one seed; LOCKWARDEN_FAULT_RUNS does
	// not apply: a control's runs may share servers a run's faults use up.
	base, _, replay := faultSeeds(t, runs)
	if replay {
		runs = 1
	}
	for i := range runs {
		seed := base + uint64(i)
		var err error
		if f.Limit > 1 {
			_, err = semFaultRun(t, seed, f)
		} else {
			_, err = faultRun(t, seed, f)
		}
		if err != nil {
			t.Logf("seed %d: %v", seed, err)
			return err
		}
		t.Logf("seed %d: no violation", seed)
	}
	return nil
}

// renew renews a client's lease called at call and returns it renewed, or
// as it was when the renewal failed; a refusal as preempted is counted.
func renew(ctx context.Context, l lock.Locker, lease *lock.Lease, ttl time.Duration, call int64, v *leaseValidity, preempted *atomic.Int64) *lock.Lease {
	renewed, err := l.Renew(ctx, lease, ttl)
	switch {
	case err == nil:
		v.renewed(call, renewed)
		return renewed
	case errors.Is(err, lock.ErrPreempted):
		preempted.Add(1)
	}
	return lease
}

// faultStats is what one mutex fault run exercised.
type faultStats struct {
	acquired, rejected, stretches int64
	// replaced and preempted count ErrReplaced and ErrPreempted answers
	// (Faults.Policies).
	replaced, preempted int64
}

// policyRequest adds the queue rules of Faults.Policies to req, as rng
// chooses: Replace for a quarter of the requests, Replace and Preempt for
// a half (a mutex's only: Preempt is for exclusive requests), and a Boost
// for half of the queued ones.
func policyRequest(req lock.Request, f Faults, rng *rand.Rand) lock.Request {
	if !f.Policies {
		return req
	}
	switch rng.IntN(4) {
	case 0:
		req.Queue, req.Replace = true, true
	case 1, 2:
		req.Queue, req.Replace, req.Preempt = true, true, req.Limit <= 1
	}
	if req.Queue && rng.IntN(2) == 0 {
		// Priority: a head start of up to two TTLs, so that boosted
		// waiters pass others and reorder the queue under the faults.
		req.Boost = time.Duration(rng.Int64N(int64(2*req.TTL) + 1))
	}
	return req
}

func faultRun(t *testing.T, seed uint64, f Faults) (faultStats, error) {
	var acquired, rejected int64
	var replaced, preempted atomic.Int64
	f = f.withDefaults(t, 4)
	ttl := f.TTL
	key := fmt.Sprintf("register-%d", seed)
	reg := &fencedRegister{}
	h := &history{start: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), f.Duration)
	defer cancel()
	var values atomic.Int64
	var wg sync.WaitGroup
	valid := &validityLog{}

	injectFaults(ctx, &wg, f, seed)

	for c := range f.Clients {
		l := f.NewLocker(t)
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(c+1))) //nolint:gosec // G404: a seeded, replayable test schedule, not a secret
			for ctx.Err() == nil {
				call := h.now()
				actx, acancel := context.WithTimeout(ctx, f.AcquireTimeout)
				lease, err := l.Acquire(actx, policyRequest(lock.Request{Keys: []string{key}, TTL: ttl, Holder: fmt.Sprintf("client-%d", c), Queue: rng.IntN(2) == 0}, f, rng))
				acancel()
				if errors.Is(err, lock.ErrReplaced) {
					replaced.Add(1)
				}
				if err != nil {
					continue
				}
				v := h.granted(valid, c, lease)
				ok := reg.write(lease.Fence, 0, true)
				h.add(c, regInput{op: opAcquire}, call, regOutput{fence: lease.Fence, accepted: ok})
				for range 1 + rng.IntN(3) {
					switch p := rng.Float64(); {
					case p < 0.25:
						// Stall past the lease's end without renewing, like a
						// long GC pause, then write anyway.
						time.Sleep(time.Until(lease.Expires) + ttl/2)
					case p < 0.5:
						call := h.now()
						lease = renew(ctx, l, lease, ttl, call, v, &preempted)
					case f.Policies && p < 0.75:
						// Work for a while within the lease, then renew: a
						// newer request has the time to preempt the lease,
						// and the renewal tells the holder.
						time.Sleep(time.Duration(rng.Int64N(int64(ttl / 3))))
						lease = renew(ctx, l, lease, ttl, h.now(), v, &preempted)
					}
					n := int(values.Add(1))
					call := h.now()
					ok := reg.write(lease.Fence, n, false)
					h.add(c, regInput{op: opWrite, fence: lease.Fence, value: n}, call, regOutput{accepted: ok})
					if rng.IntN(5) == 0 {
						call := h.now()
						v, f := reg.read()
						h.add(c, regInput{op: opRead}, call, regOutput{value: v, fence: f})
					}
				}
				v.ended()
				rctx, rcancel := context.WithTimeout(context.Background(), f.AcquireTimeout)
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
		return faultStats{acquired: acquired, rejected: rejected}, fmt.Errorf("history of %d operations is %s: a stale write was accepted or a fencing token went backwards", len(h.ops), res)
	}
	stretches := valid.all()
	st := faultStats{acquired, rejected, int64(checkedStretches(stretches, f)), replaced.Load(), preempted.Load()}
	if !f.EmptyRestarts {
		if err := checkExclusion(stretches, 1); err != nil {
			return st, err
		}
	}
	t.Logf("%d operations: %d acquisitions, %d stale writes rejected, %d stretches of validity checked for exclusion; %d waiters replaced, %d renewals refused as preempted",
		len(h.ops), acquired, rejected, st.stretches, st.replaced, st.preempted)
	return st, nil
}

// checkedStretches is how many stretches of validity a run checked for exclusion.
func checkedStretches(vs []validity, f Faults) int {
	if f.EmptyRestarts {
		return 0
	}
	return len(vs)
}

// withDefaults fills in the defaults of f's zero fields (clients: the
// number of clients). LOCKWARDEN_FAULT_DURATION=<duration> makes every run
// last at least that long, for long runs (make test-faults); a test that
// needs longer runs (long TTLs, slow failovers) keeps its own Duration.
func (f Faults) withDefaults(t *testing.T, clients int) Faults {
	t.Helper()
	if f.Clients == 0 {
		f.Clients = clients
	}
	if f.TTL == 0 {
		f.TTL = 300 * time.Millisecond
	}
	if f.Duration == 0 {
		f.Duration = 1500 * time.Millisecond
	}
	if s := os.Getenv("LOCKWARDEN_FAULT_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("LOCKWARDEN_FAULT_DURATION=%q: want a positive duration such as 30s", s)
		}
		f.Duration = max(f.Duration, d)
	}
	if f.AcquireTimeout == 0 {
		f.AcquireTimeout = time.Second
	}
	if f.FaultGap == 0 {
		f.FaultGap = 200 * time.Millisecond
	}
	return f
}

// injectFaults runs f.Inject (if set) at random gaps around f.FaultGap, on a
// schedule replayable from seed, until ctx ends.
func injectFaults(ctx context.Context, wg *sync.WaitGroup, f Faults, seed uint64) {
	inject := f.Inject
	if len(f.Nemeses) > 0 {
		// A seeded order in which every nemesis comes once before any
		// comes again, so that a run with enough faults tries them all.
		var order []int
		if f.ListedFirst {
			order = make([]int, len(f.Nemeses))
			for i := range order {
				order[i] = i
			}
		}
		inject = func(ctx context.Context, rng *rand.Rand) {
			if len(order) == 0 {
				order = rng.Perm(len(f.Nemeses))
			}
			n := f.Nemeses[order[0]]
			order = order[1:]
			if f.record != nil {
				f.record(n.Name)
			}
			n.Inject(ctx, rng)
		}
	}
	if inject == nil {
		return
	}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 0)) //nolint:gosec // G404: a seeded, replayable test schedule, not a secret
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(f.FaultGap/4 + time.Duration(rng.Int64N(int64(f.FaultGap)))):
			}
			inject(ctx, rng)
		}
	})
}
