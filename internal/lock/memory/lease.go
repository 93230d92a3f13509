package memory

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Renew extends the lease to ttl from now when its acquisition (the owner
// token with the lease's fencing token; a semaphore slot when lease.Limit >
// 1, a mutex lease otherwise) still holds every key (see lock.Locker). The
// renewed lease's Expires counts from the start of the call (validUntil).
// When the
// acquisition lost a key, because it expired (taken by another or not) or
// was replaced by a later acquisition of the owner, the keys it still held
// are released and the error matches lock.ErrLost. A renewal that took the
// whole validity (a paused store) fails with an error matching
// lock.ErrBackendUnavailable, as when the store does not answer.
func (l *Locker) Renew(ctx context.Context, lease *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
	if err := validateRenew(lease, ttl); err != nil {
		return nil, err
	}
	start := l.opts.Clock.Now()
	op := fmt.Sprintf("renew keys %q (fencing token %d)", lease.Keys, lease.Fence)
	var out renewal
	if err := l.call(ctx, op, func(now time.Time) { out = l.store.renew(now, lease, ttl) }); err != nil {
		return nil, err
	}
	return l.renewed(op, lease, ttl, start, out)
}

// RenewAll renews many leases in one call to the store (see lock.Locker),
// each as Renew does; results and errors are by index.
func (l *Locker) RenewAll(ctx context.Context, leases []*lock.Lease, ttl time.Duration) ([]*lock.Lease, []error) {
	out := make([]*lock.Lease, len(leases))
	errs := make([]error, len(leases))
	lost := make([]renewal, len(leases))
	var valid []int
	for i, le := range leases {
		if err := validateRenew(le, ttl); err != nil {
			errs[i] = fmt.Errorf("leases[%d]: %w", i, err)
			continue
		}
		valid = append(valid, i)
	}
	if len(valid) == 0 {
		return out, errs
	}
	start := l.opts.Clock.Now()
	err := l.call(ctx, fmt.Sprintf("renew %d leases", len(valid)), func(now time.Time) {
		for _, i := range valid {
			lost[i] = l.store.renew(now, leases[i], ttl)
		}
	})
	for _, i := range valid {
		if err != nil {
			errs[i] = err
			continue
		}
		op := fmt.Sprintf("renew keys %q (fencing token %d)", leases[i].Keys, leases[i].Fence)
		out[i], errs[i] = l.renewed(op, leases[i], ttl, start, lost[i])
	}
	return out, errs
}

// renewal is the store's answer to one renewal.
type renewal struct {
	// lost is the index of the first key the acquisition no longer held,
	// or -1.
	lost int
	// preempted is the index of the first key whose holding a request
	// with Preempt stopped (not renewed), or -1.
	preempted int
}

// renewed turns the store's answer to the renewal of lease that started at
// start into the renewed lease or an error.
func (l *Locker) renewed(op string, lease *lock.Lease, ttl time.Duration, start time.Time, out renewal) (*lock.Lease, error) {
	if out.lost >= 0 {
		l.opts.Log.Info("Lease lost", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
		return nil, fmt.Errorf("%s: %w: key %q is no longer held by this acquisition (it expired, or another acquisition took it)", op, lock.ErrLost, lease.Keys[out.lost])
	}
	if out.preempted >= 0 {
		return nil, fmt.Errorf("%s: %w: a newer request waits for key %q and stopped this lease; it stays valid until %s, release it once the work has stopped", op, lock.ErrPreempted, lease.Keys[out.preempted], lease.Expires.Format(time.RFC3339Nano))
	}
	next := *lease
	next.TTL = ttl
	next.Expires = validUntil(start, ttl)
	if elapsed := l.opts.Clock.Since(start); !l.opts.Clock.Now().Before(next.Expires) {
		// The call outlived the validity (the store was paused): the caller
		// keeps relying on the lease it had, until its Expires.
		return nil, fmt.Errorf("%s: %w: the renewal took %v, leaving no validity of the %v TTL (drift allowance %v)", op, lock.ErrBackendUnavailable, elapsed, ttl, drift(ttl))
	}
	if v := l.opts.Log.V(4); v.Enabled() {
		v.Info("Renewed lease", "keys", lease.Keys, "fence", lease.Fence, "ttl", ttl.String())
	}
	return &next, nil
}

// renew extends every key of lease's acquisition to now + ttl (under s.mu).
// When the acquisition no longer holds one of them, it releases the keys it
// still holds and says which was lost; when a request with Preempt stopped
// it, it extends none and says on which key.
func (s *Store) renew(now time.Time, lease *lock.Lease, ttl time.Duration) renewal {
	held := make([]*holding, len(lease.Keys))
	preempted := -1
	for i, k := range lease.Keys {
		e := s.keys[k]
		j := -1
		if e != nil {
			j = e.holdingOf(lease.Owner, lease.Fence, lease.Limit)
		}
		if j < 0 || !s.live(e.holders[j], now) {
			// Lost: never taken again behind the caller's back.
			s.release(now, lease)
			return renewal{lost: i, preempted: -1}
		}
		if preempted < 0 && e.preempts(e.holders[j]) {
			preempted = i
		}
		held[i] = e.holders[j]
	}
	if preempted >= 0 {
		return renewal{lost: -1, preempted: preempted}
	}
	for _, h := range held {
		h.expires = now.Add(ttl)
	}
	return renewal{lost: -1, preempted: -1}
}

// Release deletes the keys that the lease's acquisition (the owner token
// with the lease's fencing token; a semaphore slot when lease.Limit > 1)
// still holds, and tells their waiters and watchers (see lock.Locker); a
// later acquisition of the owner is left alone. It returns an error matching
// lock.ErrNotHeld when the acquisition held none of them.
func (l *Locker) Release(ctx context.Context, lease *lock.Lease) error {
	if err := lock.ValidateLease(lease); err != nil {
		return err
	}
	op := fmt.Sprintf("release keys %q (fencing token %d)", lease.Keys, lease.Fence)
	released := 0
	if err := l.call(ctx, op, func(now time.Time) { released = l.store.release(now, lease) }); err != nil {
		return err
	}
	if released == 0 {
		return fmt.Errorf("%s: %w: the lease expired or another acquisition replaced it", op, lock.ErrNotHeld)
	}
	if v := l.opts.Log.V(1); v.Enabled() {
		v.Info("Released lease", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
	}
	return nil
}

// release deletes the holdings of lease's acquisition (under s.mu), tells
// the waiters and watchers of the keys it still held, and returns how many
// it held (an expired holding is deleted but not counted).
func (s *Store) release(now time.Time, lease *lock.Lease) int {
	released := 0
	for _, k := range lease.Keys {
		e := s.keys[k]
		if e == nil {
			continue
		}
		j := e.holdingOf(lease.Owner, lease.Fence, lease.Limit)
		if j < 0 {
			continue
		}
		h := e.holders[j]
		e.holders = slices.Delete(e.holders, j, j+1)
		if s.live(h, now) {
			released++
			s.released(k, e)
		}
	}
	return released
}

// Dequeue removes owner from the FIFO queues of keys (a waiter giving up).
// When it was at the head of a free key's queue, or anywhere in the queue of
// a key that semaphore slots hold (its place may have been among the free
// slots), and others still wait, the key is announced as released, so that
// the next waiter tries at once. Dequeuing an owner that is not queued is not
// an error.
func (l *Locker) Dequeue(ctx context.Context, keys []string, owner string) error {
	if err := lock.ValidateKeyList("keys", keys); err != nil {
		return err
	}
	if owner == "" {
		return &lock.InvalidRequestError{Field: "owner", Reason: "the owner token of the waiter is required"}
	}
	return l.call(ctx, fmt.Sprintf("dequeue from keys %q", keys), func(now time.Time) {
		l.store.dequeue(now, keys, owner)
	})
}

// dequeue is Dequeue under s.mu.
func (s *Store) dequeue(now time.Time, keys []string, owner string) {
	for _, k := range keys {
		e := s.keys[k]
		if e == nil {
			continue
		}
		s.prune(e, now)
		i := e.position(owner)
		if i < 0 {
			continue
		}
		e.queue = slices.Delete(e.queue, i, i+1)
		mutexHeld := slices.ContainsFunc(e.holders, (*holding).mutex)
		if !mutexHeld && len(e.queue) > 0 && (i == 0 || len(e.holders) > 0) {
			s.released(k, e)
		}
	}
}

// validateRenew checks the arguments of Renew and RenewAll.
func validateRenew(lease *lock.Lease, ttl time.Duration) error {
	if err := lock.ValidateLease(lease); err != nil {
		return err
	}
	return lock.ValidateTTL(ttl)
}
