package memory

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// wait is Acquire (lock.Acquisitions) once req is prepared: it blocks until it
// holds every key of req or ctx ends (see
// lock.Locker), with lock.BlockingAcquire over TryAcquire's attempt: after a
// refusal it tries again when the busy key is released, when its holder's
// TTL ends or at the next backoff step (WithBackoff), whichever comes first;
// with req.Queue at least every third of the waiter TTL, and it leaves the
// queues when ctx ends. When ctx ends the error wraps both ctx.Err() and the
// last attempt's error.
func (l *Locker) wait(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	return lock.BlockingAcquire(ctx, &l.opts.Options, req, lock.Steps[struct{}]{
		Attempt: func(ctx context.Context) (*lock.Lease, lock.Wake[struct{}], error) {
			return l.attempt(ctx, req)
		},
		Dequeue:   func(ctx context.Context) error { return l.Dequeue(ctx, req.Keys, req.Owner) },
		Closed:    l.closed,
		ClosedErr: ErrClosed,
	})
}

// TryAcquire (lock.Acquisitions, over attempt) makes one attempt to take every
// key of req (see lock.Locker).
//
// A key is free for a mutex request (Limit 0 or 1) when no other lease holds
// it (the owner's own mutex lease is replaced, with a new token) and its
// queue is empty or has the owner at its head. A request without Queue does
// not jump a non-empty queue either: it fails with a *lock.HeldError whose
// Waiters counts the queue. With Limit N > 1 the request takes one of N
// slots: a key is free for it when no mutex lease holds it and either the
// owner holds a slot already (replaced, with a new token) or its place in
// the queue (the queue's length when it is not queued) is below the free
// slots: the smallest Limit of the request and of the holders, minus the
// holders. With req.Queue a request that cannot take the keys joins (or
// keeps its place in) every key's queue, and must call again within the
// waiter TTL to keep it; so req.Owner is required with Queue. A grant
// whose call took the whole validity (a paused store) is released, and the
// error matches lock.ErrBackendUnavailable.
//
// attempt is one acquisition of the prepared req. A refusal tells what to
// wait for: the release of the busy key, and its first holder's remaining
// TTL.
func (l *Locker) attempt(ctx context.Context, req lock.Request) (*lock.Lease, lock.Wake[struct{}], error) {
	start := l.opts.Clock.Now()
	op := fmt.Sprintf("acquire keys %q", req.Keys)
	var out outcome
	err := l.call(ctx, op, func(now time.Time) {
		out = l.store.acquire(now, req, l.opts.WaiterTTL)
	})
	switch {
	case err != nil:
		return nil, lock.Wake[struct{}]{}, err
	case out.err != nil:
		return nil, lock.Wake[struct{}]{}, fmt.Errorf("%s: %w", op, out.err)
	case out.held != nil:
		return nil, lock.Wake[struct{}]{C: out.wake, Within: out.within}, out.held
	}
	lease := lock.NewLease(req, out.fence, start, validUntil(start, req.TTL))
	if elapsed := l.opts.Clock.Since(start); !l.opts.Clock.Now().Before(lease.Expires) {
		// The call outlived the lease's validity (the store was paused): the
		// lease is of no use to the caller, and nobody else may wait for it
		// to expire.
		l.releaseGrant(ctx, lease)
		return nil, lock.Wake[struct{}]{}, fmt.Errorf("%s: %w: the call took %v, leaving no validity of the %v TTL (drift allowance %v)", op, lock.ErrBackendUnavailable, elapsed, req.TTL, drift(req.TTL))
	}
	if v := l.opts.Log.V(1); v.Enabled() {
		v.Info("Acquired lease", "keys", req.Keys, "holder", req.Holder, "fence", out.fence)
	}
	return lease, lock.Wake[struct{}]{}, nil
}

// releaseGrant releases an acquisition the caller will not use, best
// effort, even when ctx has ended (bounded by the cleanup timeout): if it
// fails, the keys expire with the TTL.
func (l *Locker) releaseGrant(ctx context.Context, lease *lock.Lease) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.CleanupTimeout)
	defer cancel()
	err := l.call(cctx, fmt.Sprintf("release keys %q (fencing token %d)", lease.Keys, lease.Fence), func(now time.Time) {
		l.store.release(now, lease)
	})
	if err != nil {
		l.opts.Log.V(2).Info("Releasing an acquisition without validity failed; it expires with its TTL", "keys", lease.Keys, "fence", lease.Fence, "err", err.Error())
	}
}

// outcome is the store's answer to one acquisition.
type outcome struct {
	// fence is the token issued when every key was taken.
	fence int64
	// held describes the first busy key when not.
	held *lock.HeldError
	// within is the remaining TTL of the busy key's first holder to expire
	// (0: no holder, the queue is what blocks).
	within time.Duration
	// wake is closed when the busy key is released.
	wake <-chan struct{}
	// err is a refusal that is not about busy keys: no token is left.
	err error
}

// acquire is one acquisition at the store's time now (under s.mu).
func (s *Store) acquire(now time.Time, req lock.Request, waiterTTL time.Duration) outcome {
	limit := req.Holders()
	for _, k := range req.Keys {
		if e := s.keys[k]; e != nil {
			s.prune(e, now)
			if _, ok := e.replaced[req.Owner]; ok {
				return outcome{err: fmt.Errorf("%w: a newer request took its place in the queue of key %q", lock.ErrReplaced, k)}
			}
		}
	}
	if req.Replace {
		s.replaceOlder(now, req, waiterTTL)
	}
	if req.Preempt {
		for _, k := range req.Keys {
			if e := s.keys[k]; e != nil {
				for _, h := range e.holders {
					if h.owner != req.Owner {
						e.preempted = max(e.preempted, h.fence)
					}
				}
			}
		}
	}
	for i, k := range req.Keys {
		e := s.keys[k]
		if e == nil || !e.busyFor(req.Owner, limit, req.Slots()) {
			continue // never used, or free for the request
		}
		if req.Queue {
			s.join(now, req, waiterTTL)
		}
		he := &lock.HeldError{Key: req.Keys[i], Position: e.position(req.Owner), Waiters: len(e.queue), Holders: len(e.holders)}
		out := outcome{held: he, wake: e.wakeChan()}
		if len(e.holders) > 0 {
			he.Holder, he.Fence = e.holders[0].holder, e.holders[0].fence
			first := e.holders[0].expires
			for _, h := range e.holders[1:] {
				if h.expires.Before(first) {
					first = h.expires
				}
			}
			out.within = first.Sub(now)
		}
		return out
	}

	// Every key is free for the request: one token for the lease, larger
	// than every token issued for any of its keys.
	var fence int64
	for _, k := range req.Keys {
		if e := s.keys[k]; e != nil {
			fence = max(fence, e.fence)
		}
	}
	fence++
	if fence >= lock.MaxFence {
		return outcome{err: fmt.Errorf("fencing token %d would reach the bound of %d (tokens are below lock.MaxFence)", fence, lock.MaxFence)}
	}
	mutex := limit <= 1
	for _, k := range req.Keys {
		e := s.entryOf(k)
		// The owner's own lease of the same kind is replaced: a later
		// acquisition of the owner (a restarted operator) supersedes it.
		e.holders = slices.DeleteFunc(e.holders, func(h *holding) bool { return h.owner == req.Owner && h.mutex() == mutex })
		e.holders = append(e.holders, &holding{owner: req.Owner, holder: req.Holder, fence: fence, limit: limit, weight: req.Slots(), acquired: now, expires: now.Add(req.TTL)})
		e.fence = fence
		if i := e.position(req.Owner); i >= 0 {
			e.queue = slices.Delete(e.queue, i, i+1)
		}
	}
	return outcome{fence: fence}
}

// busyFor tells whether e (pruned) refuses a request of owner for limit
// holders that takes weight slots (see TryAcquire).
func (e *entry) busyFor(owner string, limit, weight int) bool {
	if limit <= 1 {
		switch {
		case len(e.holders) > 1:
			return true
		case len(e.holders) == 1:
			h := e.holders[0]
			// Only the owner's own mutex lease leaves the key to it, queue
			// or not; unless it was preempted and others wait.
			return !h.mutex() || h.owner != owner ||
				(e.preempts(h) && slices.ContainsFunc(e.queue, func(w *waiter) bool { return w.owner != owner }))
		default:
			return len(e.queue) > 0 && e.queue[0].owner != owner
		}
	}
	if slices.ContainsFunc(e.holders, (*holding).mutex) {
		return true
	}
	if slices.ContainsFunc(e.holders, func(h *holding) bool { return h.owner == owner }) {
		return false
	}
	// Every holder keeps its own bound: no more slots taken than the
	// smallest limit among the request's and the holders'. Strict FIFO by
	// weight: the request fits only with the weights of every waiter
	// ahead of it (Request.Weight).
	eff, used := limit, 0
	for _, h := range e.holders {
		eff = min(eff, h.limit)
		used += h.weight
	}
	pos := e.position(owner)
	if pos < 0 {
		pos = len(e.queue)
	}
	ahead := 0
	for _, w := range e.queue[:pos] {
		ahead += w.weight
	}
	return used+ahead+weight > eff
}

// join puts req's owner, refused, in the queue of each of its keys, or
// keeps its place there and moves its deadline a waiter TTL ahead. Its
// ticket is the largest it has on any of the keys, or else a new one at the
// back of every queue; a waiter keeps the since time it joined with.
func (s *Store) join(now time.Time, req lock.Request, waiterTTL time.Duration) {
	var ticket, rank int64
	for _, k := range req.Keys {
		if e := s.keys[k]; e != nil {
			if i := e.position(req.Owner); i >= 0 && e.queue[i].ticket > ticket {
				ticket, rank = e.queue[i].ticket, e.queue[i].rank
			}
		}
	}
	if ticket == 0 {
		s.tickets++
		ticket = s.tickets
		// Arrival on a clock that never goes back, in microseconds, less
		// the head start (Request.Boost).
		s.arrival = max(s.arrival+1, now.UnixMicro())
		rank = s.arrival - req.Boost.Microseconds()
	}
	deadline := now.Add(waiterTTL)
	for _, k := range req.Keys {
		e := s.entryOf(k)
		if i := e.position(req.Owner); i >= 0 {
			e.queue[i].ticket, e.queue[i].rank, e.queue[i].deadline, e.queue[i].weight = ticket, rank, deadline, req.Slots()
		} else {
			e.queue = append(e.queue, &waiter{owner: req.Owner, holder: req.Holder, ticket: ticket, rank: rank, since: now, deadline: deadline, weight: req.Slots()})
		}
		slices.SortStableFunc(e.queue, func(a, b *waiter) int {
			return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(a.ticket, b.ticket))
		})
	}
}

// replaceOlder applies req.Replace: the waiters queued on req's keys before
// it (a smaller ticket; everyone queued when req is not) leave the queues,
// marked replaced for two waiter TTLs, and their Acquires wake to learn it.
func (s *Store) replaceOlder(now time.Time, req lock.Request, waiterTTL time.Duration) {
	mine := int64(math.MaxInt64)
	for _, k := range req.Keys {
		if e := s.keys[k]; e != nil {
			if i := e.position(req.Owner); i >= 0 {
				mine = e.queue[i].ticket
			}
		}
	}
	for _, k := range req.Keys {
		e := s.keys[k]
		if e == nil {
			continue
		}
		dropped := false
		e.queue = slices.DeleteFunc(e.queue, func(w *waiter) bool {
			if w.owner == req.Owner || w.ticket >= mine {
				return false
			}
			if e.replaced == nil {
				e.replaced = map[string]time.Time{}
			}
			e.replaced[w.owner] = now.Add(2 * waiterTTL)
			dropped = true
			return true
		})
		if dropped && e.wake != nil {
			close(e.wake)
			e.wake = nil
		}
	}
}
