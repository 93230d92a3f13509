// Package watchdog renews every lease the operator holds, batched per backend,
// and reports the leases it loses.
//
// One watchdog serves the whole manager and runs only on the elected leader.
// A lease is renewed when a third of its TTL has passed since it was last
// renewed; all the leases of one backend and TTL that are due (or nearly due)
// go to the backend in one RenewAll call, so renewal traffic grows with the
// number of backends and distinct TTLs, not with the number of leases. A renewal the backend refuses
// (the lease is gone) and a lease whose validity ran out while the backend did
// not answer are reported as lost, never silently re-acquired.
//
// The calls in flight are bounded, in all and per backend, and the free
// places go to the due batches whose leases expire first. Every call must
// come back by the time its first lease expires (its context ends then): a
// backend that stalls holds a few places, each at most until its own leases
// expire, and never the renewals of the other backends.
package watchdog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/metrics"
)

// DefaultTick is how often the watchdog looks for due renewals.
const DefaultTick = 250 * time.Millisecond

// DefaultMaxBatches is how many RenewAll calls the watchdog has in flight
// at most, over all backends.
const DefaultMaxBatches = 16

// DefaultMaxBatchesPerBackend is how many RenewAll calls the watchdog has in
// flight at most on one backend (one lock.Locker): a backend that stalls
// holds no more of the DefaultMaxBatches places than this.
const DefaultMaxBatchesPerBackend = 4

// Lost reports a lease that is no longer held, or no longer renewed: one
// that a newer request preempted (lock.ErrPreempted) still holds its keys
// until its Expires, and its holder should stop and release it.
type Lost struct {
	Ref   holder.Ref
	Lease *lock.Lease
	// Err matches lock.ErrLost, wrapping the cause, or lock.ErrPreempted.
	Err error
}

// Preempted tells whether l is a preempted lease rather than a lost one.
func (l Lost) Preempted() bool { return errors.Is(l.Err, lock.ErrPreempted) }

// Watchdog renews leases. Create it with New; it is safe for concurrent use.
type Watchdog struct {
	clock      clock.WithTicker
	tick       time.Duration
	log        logr.Logger
	maxBatches int
	// maxPerBackend bounds the calls in flight on one backend.
	maxPerBackend int

	mu     sync.Mutex
	onLost []func(Lost)
	leases map[holder.Ref]*held
	// inFlight holds the backend and TTL of every batch being renewed: its
	// leases are not sent again until it is answered.
	inFlight map[batchKey]bool
	// perBackend counts the calls in flight on each backend.
	perBackend map[lock.Locker]int
	// nextDue is no later than the earliest renewAt of the leases not in
	// flight: before it, a tick has nothing to look at (zero: look).
	nextDue time.Time
}

type held struct {
	locker  lock.Locker
	lease   *lock.Lease
	renewAt time.Time
	// sent is set while a RenewAll call carrying this lease is in flight.
	sent bool
	// failed is why the last renewal did not renew the lease (nil: none failed).
	failed error
}

// Option configures a Watchdog.
type Option func(*Watchdog)

// WithClock sets the clock (default: the real clock).
func WithClock(c clock.WithTicker) Option { return func(w *Watchdog) { w.clock = c } }

// WithTick sets how often due renewals are looked for (default DefaultTick).
func WithTick(d time.Duration) Option { return func(w *Watchdog) { w.tick = d } }

// WithLogger sets the logger (default: discard).
func WithLogger(l logr.Logger) Option { return func(w *Watchdog) { w.log = l } }

// WithMaxBatches bounds how many RenewAll calls are in flight at once, over
// all backends (default DefaultMaxBatches; at least 1). A due batch that
// finds no room waits for the next tick.
func WithMaxBatches(n int) Option { return func(w *Watchdog) { w.maxBatches = max(n, 1) } }

// WithMaxBatchesPerBackend bounds how many RenewAll calls are in flight at
// once on one backend (default DefaultMaxBatchesPerBackend; at least 1), so
// that a backend slow to answer leaves the other places to other backends.
// A due batch that finds its backend at the bound waits for the next tick.
func WithMaxBatchesPerBackend(n int) Option {
	return func(w *Watchdog) { w.maxPerBackend = max(n, 1) }
}

// New returns a watchdog that calls onLost (when not nil, from its own
// goroutine) for every lease it loses; OnLost adds more callbacks.
func New(onLost func(Lost), opts ...Option) *Watchdog {
	w := &Watchdog{
		clock:         clock.RealClock{},
		tick:          DefaultTick,
		log:           logr.Discard(),
		maxBatches:    DefaultMaxBatches,
		maxPerBackend: DefaultMaxBatchesPerBackend,
		leases:        map[holder.Ref]*held{},
		inFlight:      map[batchKey]bool{},
		perBackend:    map[lock.Locker]int{},
	}
	if onLost != nil {
		w.onLost = append(w.onLost, onLost)
	}
	for _, o := range opts {
		o(w)
	}
	return w
}

// OnLost adds f to the callbacks told (from the watchdog's goroutine) about
// every lease it loses. Register callbacks before Start.
func (w *Watchdog) OnLost(f func(Lost)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.onLost = append(w.onLost, f)
}

// Hold makes the watchdog renew lease through locker for ref, replacing what it renewed for ref before.
func (w *Watchdog) Hold(ref holder.Ref, locker lock.Locker, lease *lock.Lease) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := &held{locker: locker, lease: lease, renewAt: renewAt(lease, lease.TTL)}
	w.leases[ref] = h
	w.dueBy(h.renewAt)
	metrics.LeasesHeld.Set(float64(len(w.leases)))
}

// Holding returns the lease held for ref and the backend it is renewed through.
func (w *Watchdog) Holding(ref holder.Ref) (*lock.Lease, lock.Locker, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, ok := w.leases[ref]
	if !ok {
		return nil, nil, false
	}
	return h.lease, h.locker, true
}

// Refs returns the holders whose leases the watchdog renews, in no order,
// so that a sweep can check each against what still exists.
func (w *Watchdog) Refs() []holder.Ref {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]holder.Ref, 0, len(w.leases))
	for ref := range w.leases {
		out = append(out, ref)
	}
	return out
}

// Drop stops renewing the lease of ref and returns it (nil when none).
func (w *Watchdog) Drop(ref holder.Ref) *lock.Lease {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, ok := w.leases[ref]
	if !ok {
		return nil
	}
	delete(w.leases, ref)
	metrics.LeasesHeld.Set(float64(len(w.leases)))
	return h.lease
}

// NeedLeaderElection makes the manager run the watchdog on the leader only.
func (w *Watchdog) NeedLeaderElection() bool { return true }

// Start renews due leases until ctx ends (a manager.Runnable). Each tick
// sends the due batches without waiting for the batches still in flight:
// a backend that is slow to answer delays only its own leases. Start
// returns once the batches in flight are answered.
func (w *Watchdog) Start(ctx context.Context) error {
	t := w.clock.NewTicker(w.tick)
	defer t.Stop()
	var running sync.WaitGroup
	defer running.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			w.dispatch(ctx, &running)
		}
	}
}

// dueBy makes the next look happen no later than t. Call with w.mu held.
func (w *Watchdog) dueBy(t time.Time) {
	if w.nextDue.IsZero() || t.Before(w.nextDue) {
		w.nextDue = t
	}
}

// renewAt is when a lease is due: a third of its validity after it was
// last renewed, that is when two thirds of it are left. The validity is the
// TTL, or less when the store grants less (a ZooKeeper lease lives at most
// a session timeout): counting from the TTL alone would make such a lease
// due at once, and renewed at every tick. A lease handed to Hold may have
// been renewed a while ago, so there it counts as the TTL; right after a
// renewal it is what the store granted.
func renewAt(l *lock.Lease, validity time.Duration) time.Time {
	return l.Expires.Add(-2 * min(l.TTL, validity) / 3)
}

type batchKey struct {
	locker lock.Locker
	ttl    time.Duration
}

type batch struct {
	key    batchKey
	refs   []holder.Ref
	leases []*lock.Lease
	// expires is the earliest expiry of the leases: the call is pointless
	// after it, and the batch whose expires comes first is sent first.
	expires time.Time
}

// RenewDue renews every lease that is due now, together with the leases of
// the same backend and TTL that would be due within a sixth of their TTL, in
// one RenewAll call per backend and TTL, and returns when those calls are
// answered. A backend and TTL whose previous batch is still in flight is
// left for a later look, and so is a batch that finds no room (see Start).
func (w *Watchdog) RenewDue(ctx context.Context) {
	var wg sync.WaitGroup
	w.dispatch(ctx, &wg)
	wg.Wait()
}

// dispatch reports lost the leases that expired before a renewal could be
// sent, and starts a RenewAll call for every batch that is due, earliest
// expiry first, while the bounds on calls in flight (in all and on the
// batch's backend) leave room and the same backend and TTL has no call in
// flight; wg counts the calls started.
func (w *Watchdog) dispatch(ctx context.Context, wg *sync.WaitGroup) {
	now := w.clock.Now()
	w.mu.Lock()
	if now.Before(w.nextDue) {
		w.mu.Unlock()
		return // no lease is due yet: spare the look at every lease
	}
	var expired []Lost
	due := map[batchKey]bool{}
	for ref, h := range w.leases {
		if h.sent {
			continue // its call in flight decides
		}
		if !now.Before(h.lease.Expires) {
			// No renewal can help any more: the lease may have expired in
			// the store and someone else may hold the keys.
			delete(w.leases, ref)
			expired = append(expired, Lost{Ref: ref, Lease: h.lease, Err: expiredErr(h, now)})
			continue
		}
		if !now.Before(h.renewAt) {
			k := batchKey{h.locker, h.lease.TTL}
			if !w.inFlight[k] {
				due[k] = true
			}
		}
	}
	batches := map[batchKey]*batch{}
	var next time.Time // the earliest renewAt of the leases left out
	for ref, h := range w.leases {
		k := batchKey{h.locker, h.lease.TTL}
		if !due[k] || now.Before(h.renewAt.Add(-h.lease.TTL/6)) {
			if !w.inFlight[k] && (next.IsZero() || h.renewAt.Before(next)) {
				next = h.renewAt
			}
			continue
		}
		b := batches[k]
		if b == nil {
			b = &batch{key: k, expires: h.lease.Expires}
			batches[k] = b
		}
		b.refs = append(b.refs, ref)
		b.leases = append(b.leases, h.lease)
		if h.lease.Expires.Before(b.expires) {
			b.expires = h.lease.Expires
		}
	}
	// Leases in flight move nextDue when their batch is answered.
	w.nextDue = next
	if next.IsZero() {
		w.nextDue = now.Add(24 * time.Hour)
	}
	order := make([]*batch, 0, len(batches))
	for _, b := range batches {
		order = append(order, b)
	}
	// The most urgent renewal first: a place that frees goes to the batch
	// whose lease would expire first, not to whichever the map yields.
	slices.SortFunc(order, func(a, b *batch) int { return a.expires.Compare(b.expires) })
	for _, b := range order {
		k := b.key
		if len(w.inFlight) >= w.maxBatches || w.perBackend[k.locker] >= w.maxPerBackend {
			w.log.V(1).Info("Too many renewals in flight; the batch waits for the next tick",
				"leases", len(b.leases), "ttl", k.ttl.String(), "validFor", b.expires.Sub(now).String(),
				"inFlight", len(w.inFlight), "inFlightOnBackend", w.perBackend[k.locker])
			w.dueBy(now)
			continue
		}
		w.inFlight[k] = true
		w.perBackend[k.locker]++
		for _, ref := range b.refs {
			w.leases[ref].sent = true
		}
		// The call ends when its first lease expires: an answer after that
		// renews nothing that is still held, and a backend that stalls
		// holds the place no longer than its own leases last.
		cctx, cancel := context.WithTimeout(ctx, b.expires.Sub(now))
		wg.Add(1)
		go func() {
			defer func() {
				cancel()
				w.mu.Lock()
				delete(w.inFlight, k)
				if w.perBackend[k.locker]--; w.perBackend[k.locker] <= 0 {
					delete(w.perBackend, k.locker)
				}
				// The leases of k left out of nextDue while in flight
				// count again: look at every lease on the next tick.
				w.nextDue = time.Time{}
				w.mu.Unlock()
				wg.Done()
			}()
			w.renewBatch(cctx, k, b)
		}()
	}
	if len(expired) > 0 {
		for _, l := range expired {
			metrics.Renewals.WithLabelValues(metrics.ResultLost).Inc()
			if v := w.log.V(1); v.Enabled() {
				v.Info("Lease expired before it could be renewed", "kind", l.Ref.Kind, "namespace", l.Ref.Namespace, "name", l.Ref.Name)
			}
		}
		metrics.LeasesHeld.Set(float64(len(w.leases)))
	}
	callbacks := w.onLost
	w.mu.Unlock()
	w.report(expired, callbacks)
}

// expiredErr explains a lease that expired before a renewal could be sent.
func expiredErr(h *held, now time.Time) error {
	err := fmt.Errorf("%w: expired %v ago before a renewal could be sent", lock.ErrLost, now.Sub(h.lease.Expires))
	if h.failed != nil {
		err = errors.Join(err, h.failed)
	}
	return err
}

func (w *Watchdog) renewBatch(ctx context.Context, k batchKey, b *batch) {
	metrics.RenewalBatches.Inc()
	renewed, errs := k.locker.RenewAll(ctx, b.leases, k.ttl)
	now := w.clock.Now()
	var lost []Lost
	var renewedN, failedN int
	w.mu.Lock()
	for i, ref := range b.refs {
		h, ok := w.leases[ref]
		if !ok || h.lease != b.leases[i] {
			continue // dropped or replaced while the renewal was in flight
		}
		h.sent = false
		var err error
		if i < len(errs) {
			err = errs[i]
		}
		switch {
		case err == nil && i < len(renewed) && renewed[i] != nil:
			renewedN++
			h.lease = renewed[i]
			h.failed = nil
			h.renewAt = renewAt(renewed[i], renewed[i].Expires.Sub(now))
			w.dueBy(h.renewAt)
		case err != nil && errors.Is(err, lock.ErrPreempted):
			// Renewing again would fail again: the holder is told to stop,
			// and releases the lease (valid until its Expires) when it has.
			metrics.Renewals.WithLabelValues(metrics.ResultPreempted).Inc()
			delete(w.leases, ref)
			lost = append(lost, Lost{Ref: ref, Lease: h.lease, Err: err})
		case err != nil && errors.Is(err, lock.ErrLost):
			metrics.Renewals.WithLabelValues(metrics.ResultLost).Inc()
			delete(w.leases, ref)
			lost = append(lost, Lost{Ref: ref, Lease: h.lease, Err: err})
		case !now.Before(h.lease.Expires):
			// The backend did not answer for the whole validity: the lease
			// may have expired there and someone else may hold it now.
			metrics.Renewals.WithLabelValues(metrics.ResultError).Inc()
			delete(w.leases, ref)
			lost = append(lost, Lost{Ref: ref, Lease: h.lease, Err: errors.Join(lock.ErrLost, err)})
		default:
			failedN++
			h.failed = err
			w.dueBy(h.renewAt) // due: retried on the next tick
			// The message of an error is built only when logged: a batch
			// that failed on a node has thousands of them.
			if v := w.log.V(1); v.Enabled() {
				v.Info("Renewal failed; retrying", "kind", ref.Kind, "namespace", ref.Namespace, "name", ref.Name,
					"validFor", h.lease.Expires.Sub(now).String(), "error", errString(err))
			}
		}
	}
	metrics.LeasesHeld.Set(float64(len(w.leases)))
	callbacks := w.onLost
	w.mu.Unlock()
	metrics.Renewals.WithLabelValues(metrics.ResultOK).Add(float64(renewedN))
	metrics.Renewals.WithLabelValues(metrics.ResultError).Add(float64(failedN))
	w.report(lost, callbacks)
}

// report counts, logs and hands to the callbacks the leases lost. Call
// without w.mu held.
func (w *Watchdog) report(lost []Lost, callbacks []func(Lost)) {
	for _, l := range lost {
		if l.Preempted() {
			w.log.Info("Lease preempted", "kind", l.Ref.Kind, "namespace", l.Ref.Namespace, "name", l.Ref.Name, "fence", l.Lease.Fence, "validUntil", l.Lease.Expires, "error", l.Err.Error())
		} else {
			metrics.LeasesLost.WithLabelValues(l.Ref.Kind).Inc()
			w.log.Info("Lost lease", "kind", l.Ref.Kind, "namespace", l.Ref.Namespace, "name", l.Ref.Name, "fence", l.Lease.Fence, "error", l.Err.Error())
		}
		for _, f := range callbacks {
			f(l)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "no lease returned"
	}
	return err.Error()
}
