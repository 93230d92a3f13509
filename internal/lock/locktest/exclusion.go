package locktest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Exclusion is the promise every fault run checks besides the fencing
// tokens: at no instant are more than Limit leases of a key valid. A lease is
// valid on its client from the moment its grant returned until it was
// released or its Expires passed, whichever came first; a renewal that
// returns after Expires had passed starts a new stretch of validity, it does
// not close the gap. Every stretch is measured on the test's one monotonic
// clock, so two stretches that overlap are two clients that both had the
// right to act on the key at the same instant: no interleaving of the
// store's events can excuse that.

// validity is one stretch in which a client held a valid lease.
type validity struct {
	client   int
	fence    int64
	from, to int64 // nanoseconds since the history's start; the stretch is [from, to)
	// weight is the slots the lease takes (lock.Lease.Weight, at least 1).
	weight int
}

// slots is the weight of v, at least 1.
func (v validity) slots() int { return max(v.weight, 1) }

// validityLog collects the stretches of one run.
type validityLog struct {
	mu sync.Mutex
	vs []validity
}

func (l *validityLog) add(v validity) {
	if v.to <= v.from {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.vs = append(l.vs, v)
}

func (l *validityLog) all() []validity {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.vs)
}

// ExclusionError is a violation of exclusion: more than Limit leases were
// valid at the instant At (since the run's start).
type ExclusionError struct {
	Limit int
	At    time.Duration
	// Valid describes the leases valid at At: client, fencing token and
	// stretch of validity.
	Valid []string
	// Slots is the weight of the leases valid at At.
	Slots int
}

func (e *ExclusionError) Error() string {
	return fmt.Sprintf("exclusion violated: %d leases taking %d slots valid at %v, more than the limit of %d: %s",
		len(e.Valid), e.Slots, e.At, e.Limit, strings.Join(e.Valid, "; "))
}

// checkExclusion returns an *ExclusionError for the first instant at which
// more than limit stretches overlap, or nil. Stretches are closed at their
// start and open at their end: a lease that ends at t and one that starts at
// t do not overlap.
func checkExclusion(vs []validity, limit int) error {
	type event struct {
		t    int64
		d    int
		item int
	}
	evs := make([]event, 0, 2*len(vs))
	for i, v := range vs {
		evs = append(evs, event{v.from, 1, i}, event{v.to, -1, i})
	}
	slices.SortFunc(evs, func(a, b event) int {
		if c := cmp.Compare(a.t, b.t); c != 0 {
			return c
		}
		return cmp.Compare(a.d, b.d) // a leave before an enter at the same instant
	})
	open, used := map[int]bool{}, 0
	for _, e := range evs {
		if e.d < 0 {
			delete(open, e.item)
			used -= vs[e.item].slots()
			continue
		}
		open[e.item] = true
		used += vs[e.item].slots()
		if used <= max(limit, 1) {
			continue
		}
		items := make([]int, 0, len(open))
		for i := range open {
			items = append(items, i)
		}
		slices.SortFunc(items, func(a, b int) int { return cmp.Compare(vs[a].from, vs[b].from) })
		err := &ExclusionError{Limit: limit, At: time.Duration(e.t), Slots: used}
		for _, i := range items {
			v := vs[i]
			err.Valid = append(err.Valid, fmt.Sprintf("client %d fence %d weight %d valid [%v, %v)", v.client, v.fence, v.slots(), time.Duration(v.from), time.Duration(v.to)))
		}
		return err
	}
	return nil
}

// leaseValidity follows one lease on its client: it opens a stretch when the
// grant returns and extends it with every renewal that returns in time.
type leaseValidity struct {
	h      *history
	log    *validityLog
	client int
	fence  int64
	weight int
	from   int64
	until  int64 // the lease's Expires, since the history's start
}

func (h *history) at(t time.Time) int64 { return int64(t.Sub(h.start)) }

// granted starts following lease, whose grant has just returned.
func (h *history) granted(log *validityLog, client int, lease *lock.Lease) *leaseValidity {
	return &leaseValidity{h: h, log: log, client: client, fence: lease.Fence, weight: lease.Weight, from: h.now(), until: h.at(lease.Expires)}
}

// renewed records a renewal that was sent at call and has just returned
// with lease. Sent after the lease had lapsed, it starts a new stretch.
func (v *leaseValidity) renewed(call int64, lease *lock.Lease) {
	now := v.h.now()
	if call >= v.until {
		v.log.add(validity{client: v.client, fence: v.fence, weight: v.weight, from: v.from, to: v.until})
		v.from = now
	}
	v.until = v.h.at(lease.Expires)
}

// ended closes the last stretch: the client stops relying on the lease now
// (it is about to release it), or earlier when it had expired.
func (v *leaseValidity) ended() {
	v.log.add(validity{client: v.client, fence: v.fence, weight: v.weight, from: v.from, to: min(v.h.now(), v.until)})
}

// LateExpiry returns a Locker that reports every lease as valid for extra
// longer than l granted it: the mutant of a store whose expiry comparison is
// off. The fault harness must catch it (TestFaultHarnessCatchesAMutant in the
// store packages); a harness that passes it proves nothing.
func LateExpiry(l lock.Locker, extra time.Duration) lock.Locker {
	return &lateExpiry{Locker: l, extra: extra}
}

type lateExpiry struct {
	lock.Locker
	extra time.Duration
}

func (m *lateExpiry) late(lease *lock.Lease, err error) (*lock.Lease, error) {
	if lease != nil {
		c := *lease
		c.Expires = c.Expires.Add(m.extra)
		lease = &c
	}
	return lease, err
}

func (m *lateExpiry) TryAcquire(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	return m.late(m.Locker.TryAcquire(ctx, req))
}

func (m *lateExpiry) Acquire(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	return m.late(m.Locker.Acquire(ctx, req))
}

func (m *lateExpiry) Renew(ctx context.Context, lease *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
	return m.late(m.Locker.Renew(ctx, lease, ttl))
}

func (m *lateExpiry) RenewAll(ctx context.Context, leases []*lock.Lease, ttl time.Duration) ([]*lock.Lease, []error) {
	out, errs := m.Locker.RenewAll(ctx, leases, ttl)
	for i := range out {
		out[i], _ = m.late(out[i], nil)
	}
	return out, errs
}

// PreemptTakesOver returns a factory of Lockers on newLocker's store that
// behave as a store that ends a preempted lease at once instead of letting
// it run to its Expires: a request with Preempt that finds its key held
// releases the holder's lease, behind the holder's back, and takes the key.
// It is the mutant of the preemption rule (Faults.Policies): the fault
// harness must catch it, as two valid holders. The Lockers of one factory
// share what they hold, as one store's clients do.
func PreemptTakesOver(newLocker func(t *testing.T) lock.Locker) func(t *testing.T) lock.Locker {
	shared := &heldLeases{by: map[string]heldLease{}}
	return func(t *testing.T) lock.Locker {
		return &preemptTakesOver{Locker: newLocker(t), held: shared}
	}
}

// heldLeases is the lease each key was last granted, and through which
// Locker, for PreemptTakesOver.
type heldLeases struct {
	mu sync.Mutex
	by map[string]heldLease
}

type heldLease struct {
	locker lock.Locker
	lease  *lock.Lease
}

type preemptTakesOver struct {
	lock.Locker
	held *heldLeases
}

func (m *preemptTakesOver) granted(lease *lock.Lease, err error) (*lock.Lease, error) {
	if err == nil {
		m.held.mu.Lock()
		m.held.by[lease.Keys[0]] = heldLease{m.Locker, lease}
		m.held.mu.Unlock()
	}
	return lease, err
}

// takeOver tries req; when a Preempt request finds its key held, it
// releases the holder's lease and tries again. It tells whether it
// answered (ok false: the caller goes on as the store would).
func (m *preemptTakesOver) takeOver(ctx context.Context, req lock.Request) (lease *lock.Lease, err error, ok bool) {
	if !req.Preempt {
		return nil, nil, false
	}
	lease, err = m.Locker.TryAcquire(ctx, req)
	if err == nil || !errors.As(err, new(*lock.HeldError)) {
		return lease, err, true
	}
	m.held.mu.Lock()
	h, held := m.held.by[req.Keys[0]]
	m.held.mu.Unlock()
	if held {
		_ = h.locker.Release(ctx, h.lease)
	}
	lease, err = m.Locker.TryAcquire(ctx, req)
	return lease, err, err == nil
}

func (m *preemptTakesOver) TryAcquire(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	if req.Owner == "" {
		req.Owner, _ = lock.NewOwnerToken()
	}
	if lease, err, ok := m.takeOver(ctx, req); ok {
		return m.granted(lease, err)
	}
	return m.granted(m.Locker.TryAcquire(ctx, req))
}

func (m *preemptTakesOver) Acquire(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	if req.Owner == "" {
		req.Owner, _ = lock.NewOwnerToken() // one owner for every attempt, as the store's
	}
	if lease, err, ok := m.takeOver(ctx, req); ok {
		return m.granted(lease, err)
	}
	return m.granted(m.Locker.Acquire(ctx, req))
}

func (m *preemptTakesOver) Renew(ctx context.Context, lease *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
	return m.granted(m.Locker.Renew(ctx, lease, ttl))
}
