// Package memory is an in-memory lock.Locker: the leases, fencing tokens and
// FIFO queues live in a Store inside the process. Controllers' unit tests use
// it as a fast store with a fake clock, and it is the reference for what a
// store must do: it implements the semantics of the Redis store (package
// lock/redis) without a network, and passes the conformance suites of
// package lock/locktest.
//
// A Store is the backend, and a Locker one client of it: several Lockers on
// one Store (Store.NewLocker) behave like several processes on one server.
// New makes a Locker on a Store of its own. A Store can stall (Pause) and
// lose its replies (DropReplies): the faults an in-memory store can really
// have, which the fault suite injects.
//
// The rules, as in the Redis store:
//   - A lease holds its keys while the store's clock is before its expiry
//     (the grant or last renewal plus the TTL); from that instant the keys
//     are free. The Lease a Locker returns is valid until the start of the
//     call plus the TTL, less the drift allowance every store subtracts.
//   - A fencing token is the largest token issued so far for any key of the
//     lease, plus one: strictly increasing per key, across the holders of a
//     semaphore too, and below lock.MaxFence.
//   - An acquisition is identified by its owner token and its fencing token:
//     Renew and Release act on that acquisition only. An owner that acquires
//     keys it holds already replaces its lease with a new one (a new token).
//   - A key's queue is FIFO by arrival less the request's Boost (then by
//     ticket): equal boosts are served in arrival order. A waiter keeps its place by calling
//     again within the waiter TTL of its Locker; one that does not is pruned
//     and joins at the back when it calls again.
//   - A request with Replace drops the waiters with a smaller ticket from
//     its keys' queues and marks their owners replaced for two waiter TTLs;
//     one with Preempt also raises its busy keys' preemption mark to their
//     holders' largest token, and a holding at or below the mark is not
//     renewed.
package memory

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// storeName names this store in its *lock.ConfigError.
const storeName = "memory"

// watchBuffer is how many release notifications a Watch channel buffers;
// when its reader falls further behind, notifications are dropped (a waiter
// polls too), so that a slow reader never blocks a Release.
const watchBuffer = 64

// ErrClosed is wrapped, together with lock.ErrBackendUnavailable, by the
// errors of a Locker's calls after Close.
var ErrClosed = errors.New("the memory Locker is closed")

// Store is the state of an in-memory lock backend: every key's holders,
// fencing token and queue, behind one mutex. Lockers made by NewLocker share
// it, like processes that share a server. A Store needs no closing.
type Store struct {
	clock clock.PassiveClock

	mu       sync.Mutex
	keys     map[string]*entry
	tickets  int64         // the last queue ticket handed out, for every key
	arrival  int64         // the last waiter's arrival (µs), never going back
	resumed  chan struct{} // non-nil while paused; Resume closes it
	dropping bool          // replies (and release notifications) are lost
	stalled  int           // calls waiting for the store to resume
	watchers map[*watcher]struct{}

	// earlyExpiry is a mutant for the fault suite's negative control (set
	// by tests only): the store takes a lease for expired this long before
	// its TTL ends, and gives its keys to others while it is still valid.
	earlyExpiry time.Duration
}

// StoreOption configures a Store.
type StoreOption func(*Store)

// WithStoreClock sets the store's clock: it judges when leases and waiters
// expire and stamps the times Inspect reports (the server's clock of a real
// store). A *testingclock.FakeClock makes expiry follow the test. Lockers
// made by NewLocker use it too unless given WithClock. Default: the real
// clock.
func WithStoreClock(c clock.PassiveClock) StoreOption { return func(s *Store) { s.clock = c } }

// NewStore returns an empty Store. The error is a *lock.ConfigError naming
// the option that is wrong.
func NewStore(opts ...StoreOption) (*Store, error) {
	s := &Store{clock: clock.RealClock{}, keys: map[string]*entry{}, watchers: map[*watcher]struct{}{}}
	for _, o := range opts {
		o(s)
	}
	if s.clock == nil {
		return nil, &lock.ConfigError{Store: storeName, Field: "WithStoreClock", Reason: "the clock must not be nil"}
	}
	return s, nil
}

// Option configures a Locker.
type Option func(*options)

// options are a Locker's settings: only the ones every store shares.
type options struct {
	lock.Options
}

// WithClock sets the Locker's clock: it stamps the leases it returns
// (Acquired, and Expires: the start of the call plus the TTL, less the
// drift allowance; see validUntil) and, when it is a clock.Clock (a
// *testingclock.FakeClock is), times Acquire's waits. Default: the store's clock (WithStoreClock); New gives its store this one.
func WithClock(c clock.PassiveClock) Option { return func(o *options) { o.Clock = c } }

// WithLogger sets the logger. Acquisitions and releases are logged at V(1),
// lost leases at V(0), Acquire's waits at V(4). Default: logr.Discard().
func WithLogger(l logr.Logger) Option { return func(o *options) { o.Log = l } }

// WithBackoff sets Acquire's fallback polling between attempts when no
// release wakes it (exponential with jitter; Cap bounds the wait; Steps is
// ignored). A release resets it. Default: lock.DefaultBackoff.
func WithBackoff(b wait.Backoff) Option { return func(o *options) { o.Backoff = b } }

// WithWaiterTTL sets how long a waiter of this Locker keeps its place in a
// key's queue without calling again; Acquire calls at least every third of
// it. Default: lock.DefaultWaiterTTL (30s); at least lock.MinWaiterTTL.
func WithWaiterTTL(d time.Duration) Option { return func(o *options) { o.WaiterTTL = d } }

// buildOptions applies opts over the shared defaults, with clock c (the
// store's) unless WithClock is among them.
func buildOptions(c clock.PassiveClock, opts []Option) (options, error) {
	o := options{Options: lock.DefaultOptions()}
	o.Clock = c
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.Validate(storeName); err != nil {
		return o, err
	}
	return o, nil
}

// Locker is one client of a Store: a lock.Locker. Every method is safe for
// concurrent use.
type Locker struct {
	store     *Store
	opts      options
	closed    chan struct{}
	closeOnce sync.Once

	lock.Acquisitions[lock.Wake[struct{}]] // TryAcquire and Acquire, over attempt and wait
}

var (
	_ lock.Locker         = (*Locker)(nil)
	_ lock.BatchInspector = (*Locker)(nil)
)

// New returns a Locker on a new Store of its own, whose clock is the
// Locker's (WithClock). The error is a *lock.ConfigError naming the option
// that is wrong.
func New(opts ...Option) (*Locker, error) {
	o, err := buildOptions(clock.RealClock{}, opts)
	if err != nil {
		return nil, err
	}
	s, err := NewStore(WithStoreClock(o.Clock))
	if err != nil {
		return nil, err
	}
	return s.newLocker(o), nil
}

// NewLocker returns a new client of s. The error is a *lock.ConfigError
// naming the option that is wrong.
func (s *Store) NewLocker(opts ...Option) (*Locker, error) {
	o, err := buildOptions(s.clock, opts)
	if err != nil {
		return nil, err
	}
	return s.newLocker(o), nil
}

func (s *Store) newLocker(o options) *Locker {
	l := &Locker{store: s, opts: o, closed: make(chan struct{})}
	l.Acquisitions = lock.Acquisitions[lock.Wake[struct{}]]{Attempt: l.attempt, Wait: l.wait, Weights: true}
	return l
}

// Store returns the Store the Locker is a client of (to pause it, say).
func (l *Locker) Store() *Store { return l.store }

// Close ends the Locker's watches; its later calls fail with an error
// matching ErrClosed and lock.ErrBackendUnavailable, and so do the calls
// waiting out a paused store. The leases it holds stay in the Store until
// released or expired. Closing again does nothing.
func (l *Locker) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		s := l.store
		s.mu.Lock()
		defer s.mu.Unlock()
		for w := range s.watchers {
			if w.locker == l {
				s.endWatch(w)
			}
		}
	})
	return nil
}

// drift is the clock drift allowance of a lease of the given TTL, the one
// every store subtracts: 1% of the TTL plus 2ms.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// validUntil is the Expires of a lease acquired or renewed with ttl by a
// call that started at start (the Locker's clock, read before the store
// changed anything): start + ttl, less the drift allowance. The store keeps
// the keys until its own clock reaches the grant (or renewal) plus ttl, which
// is no earlier; the allowance covers a Locker clock that is not the
// store's (WithClock), and a caller whose own reading of the time came
// before the call's.
func validUntil(start time.Time, ttl time.Duration) time.Time {
	return start.Add(ttl - drift(ttl))
}

// closedError is the error of a call after Close.
func closedError(op string) error {
	return fmt.Errorf("%s: %w: %w", op, lock.ErrBackendUnavailable, ErrClosed)
}

// call runs fn on the store under its mutex with the store's clock reading,
// as one round trip of the Locker: it fails without running fn when the
// Locker is closed or ctx has ended, waits while the store is paused (until
// it resumes, ctx ends or the Locker is closed), and, when the store drops
// replies, runs fn and reports the reply lost.
func (l *Locker) call(ctx context.Context, op string, fn func(now time.Time)) error {
	select {
	case <-l.closed:
		return closedError(op)
	default:
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	s := l.store
	s.mu.Lock()
	for s.resumed != nil {
		resumed := s.resumed
		s.stalled++
		s.mu.Unlock()
		var err error
		select {
		case <-resumed:
		case <-ctx.Done():
			err = fmt.Errorf("%s: %w: the store is paused and did not answer: %w", op, lock.ErrBackendUnavailable, ctx.Err())
		case <-l.closed:
			err = closedError(op)
		}
		s.mu.Lock()
		s.stalled--
		if err != nil {
			s.mu.Unlock()
			return err
		}
	}
	defer s.mu.Unlock()
	fn(s.clock.Now())
	if s.dropping {
		return fmt.Errorf("%s: %w: the reply was lost (the store ran the call)", op, lock.ErrBackendUnavailable)
	}
	return nil
}

// entry is what the store holds for one key.
type entry struct {
	// fence is the last fencing token issued for the key (0: none).
	fence int64
	// holders are the leases holding the key, oldest (smallest token)
	// first: one mutex lease, or a semaphore's slots. Expired ones stay
	// until the next call that changes the key prunes them.
	holders []*holding
	// queue is the key's FIFO queue, by ticket.
	queue []*waiter
	// wake, when some Acquire waits for the key, is closed when the key is
	// released (or its queue's head leaves) and then replaced.
	wake chan struct{}
	// replaced are the owners a request with Replace dropped from the
	// queue, each until when its calls are told so (lock.ErrReplaced).
	replaced map[string]time.Time
	// preempted is the largest fencing token a request with Preempt
	// stopped: a holding with a token up to it is no longer renewed.
	preempted int64
}

// holding is one lease on one key.
type holding struct {
	owner, holder string
	fence         int64
	// limit is the Limit the lease was acquired with, at least 1: 1 is a
	// mutex lease, more a semaphore slot.
	limit int
	// weight is the slots it takes (Request.Slots).
	weight            int
	acquired, expires time.Time
}

// mutex tells a mutex lease from a semaphore slot.
func (h *holding) mutex() bool { return h.limit <= 1 }

// waiter is one place in a key's queue.
type waiter struct {
	owner, holder string
	// ticket is the waiter's arrival (Replace drops the smaller ones);
	// rank orders the queue: its arrival in microseconds less its
	// Request.Boost, then the ticket.
	ticket, rank    int64
	since, deadline time.Time
	// weight is the slots it asks for (Request.Slots).
	weight int
}

// live tells whether h still holds its key at now.
func (s *Store) live(h *holding, now time.Time) bool {
	return now.Add(s.earlyExpiry).Before(h.expires)
}

// waiting tells whether w keeps its place at now: until its deadline, inclusive.
func waiting(w *waiter, now time.Time) bool { return !w.deadline.Before(now) }

// prune drops e's expired holders, the waiters past their deadline and the
// replacement marks past theirs.
func (s *Store) prune(e *entry, now time.Time) {
	e.holders = slices.DeleteFunc(e.holders, func(h *holding) bool { return !s.live(h, now) })
	e.queue = slices.DeleteFunc(e.queue, func(w *waiter) bool { return !waiting(w, now) })
	maps.DeleteFunc(e.replaced, func(_ string, until time.Time) bool { return until.Before(now) })
}

// preempts tells whether h is a holding a request with Preempt stopped.
func (e *entry) preempts(h *holding) bool { return h.fence <= e.preempted }

// entryOf returns key's entry, created when missing.
func (s *Store) entryOf(key string) *entry {
	e := s.keys[key]
	if e == nil {
		e = &entry{}
		s.keys[key] = e
	}
	return e
}

// position is owner's place in e's queue (0: the head), or -1.
func (e *entry) position(owner string) int {
	return slices.IndexFunc(e.queue, func(w *waiter) bool { return w.owner == owner })
}

// holdingOf returns the index of the holding of the acquisition (owner,
// fence) among e's holders, a mutex lease when limit is at most 1 and a
// semaphore slot otherwise, or -1.
func (e *entry) holdingOf(owner string, fence int64, limit int) int {
	return slices.IndexFunc(e.holders, func(h *holding) bool {
		return h.owner == owner && h.fence == fence && h.mutex() == (limit <= 1)
	})
}

// wakeChan returns the channel closed when key e is next released.
func (e *entry) wakeChan() <-chan struct{} {
	if e.wake == nil {
		e.wake = make(chan struct{})
	}
	return e.wake
}

// released tells the waiters of key (e) and the watchers that it was
// released, unless the store drops its replies: then the notifications are
// lost, as on a broken connection.
func (s *Store) released(key string, e *entry) {
	if s.dropping {
		return
	}
	if e.wake != nil {
		close(e.wake)
		e.wake = nil
	}
	for w := range s.watchers {
		if w.keys == nil || slices.Contains(w.keys, key) {
			select {
			case w.ch <- key:
			default:
				w.locker.opts.Log.V(2).Info("Dropped a release notification: the watcher is not reading", "key", key)
			}
		}
	}
}

// watcher is one Watch.
type watcher struct {
	locker *Locker
	keys   []string // nil: every key
	ch     chan string
}

// endWatch removes w and closes its channel (under s.mu).
func (s *Store) endWatch(w *watcher) {
	if _, ok := s.watchers[w]; ok {
		delete(s.watchers, w)
		close(w.ch)
	}
}

// Ping is the health check the operator's backend registry makes: one
// round trip to the store, which fails when the Locker is closed or the
// store drops its replies, and waits while the store is paused.
func (l *Locker) Ping(ctx context.Context) error {
	return l.call(ctx, "ping", func(time.Time) {})
}
