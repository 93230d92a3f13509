package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// wait is Acquire (lock.Acquisitions) once req is prepared: it blocks until it
// holds every key of req or ctx ends (see lock.Locker).
// It tries once; when the keys are busy it starts watching their releases
// (LISTEN on the Locker's listening connection) and tries again at once (so
// a release between the first try and the watch is not missed; while the
// listening connection is still coming up, it is told when it does), then after
// each failed try waits for a notification, the holder's remaining TTL or the
// next backoff step (WithBackoff), whichever comes first. With req.Queue it
// waits in the keys' FIFO queues, calling again at least every third of the
// waiter TTL, and leaves the queues when ctx ends. Database errors are
// retried too; when ctx ends the error wraps both ctx.Err() and the last
// attempt's error.
func (l *Locker) wait(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	// LISTEN runs on the Locker's listening connection: only for busy keys.
	return lock.AcquireOnReleases(ctx, &l.opts.Options, req,
		func(ctx context.Context) (*lock.Lease, time.Duration, error) { return l.attempt(ctx, req) },
		l.watchForAcquire, l.Dequeue)
}

// check checks a prepared request against PostgreSQL's own limits (see
// lock.Acquisitions): the key length, and text without NUL bytes.
func check(req lock.Request) error {
	if err := validateKeyLengths("keys", req.Keys); err != nil {
		return err
	}
	if err := validateText("owner", req.Owner); err != nil {
		return err
	}
	return validateText("holder", req.Holder)
}

// TryAcquire (lock.Acquisitions, over attempt) makes one attempt to take every
// key of req (see lock.Locker).
//
// A key is free for req when no live lease of another owner holds it and its
// FIFO queue is empty or has req's owner at its head: a request without
// Queue does not jump a non-empty queue either (it fails with a
// *lock.HeldError whose Waiters counts the queue). With req.Queue a request
// that cannot take the keys joins (or refreshes its place in) the queue of
// every key, and must call again within the waiter TTL to keep it; so
// req.Owner is required with Queue. The HeldError's Holders is the number
// of live leases on the busy key (0 when it is free but others are queued
// ahead) and names the oldest; Waiters is the exact number of live waiters,
// the caller included.
//
// With req.Limit above 1 the lease takes req.Weight (at least 1) of the
// Limit slots of each key (a semaphore, see the package documentation): a
// key is free for it when no mutex lease holds it and the weights of its
// live holders, of the live waiters queued ahead of it (all of them when it
// is not queued) and its own sum to no more than the smallest limit of the
// request and of the key's live holders. The HeldError's Holders still
// counts leases, not slots.
//
// When the call fails on the way (the database or the connection), the error
// matches lock.ErrBackendUnavailable. The transaction may have committed
// before the reply was lost, with a token the call does not know: such a
// lease is not released (that could free a later acquisition of the same
// owner by another process), it expires with its TTL or is taken over by the
// owner's next attempt.
//
// attempt is one call of the acquire function. It returns the lease, or a
// hint of when the busy holder's lease ends (0 when unknown) and the error.
func (l *Locker) attempt(ctx context.Context, req lock.Request) (*lock.Lease, time.Duration, error) {
	var start time.Time
	octx, cancel := l.opContext(ctx, req.TTL)
	defer cancel()
	var (
		ok                                      bool
		fence, busyFence, ttlMs                 int64
		busy, position, queued, count, replaced int32
		busyHolder, syncCommit                  string
	)
	limit := req.Limit
	if limit > 1 {
		// The negative control's mutant admits more holders than asked.
		limit += l.opts.admitExtra
	}
	err := l.call(octx, fmt.Sprintf("acquire keys %q", req.Keys), func(ctx context.Context, c *pgx.Conn) error {
		// The validity runs from when the statement goes out, after the
		// connection (and the schema check) is ready.
		start = l.opts.Now()
		return c.QueryRow(ctx, l.sql.acquire,
			encodeKeys(req.Keys), ownerDigest(req.Owner), req.Holder, req.TTL.Milliseconds(),
			req.Queue, l.opts.WaiterTTL.Milliseconds(), lock.MaxFence-1, limit, req.Replace, req.Preempt,
			req.Boost.Microseconds(), req.Slots(),
		).Scan(&ok, &fence, &busy, &busyHolder, &busyFence, &position, &queued, &ttlMs, &count, &replaced, &syncCommit)
	})
	if err != nil {
		l.log.V(2).Info("Acquire failed", "keys", req.Keys, "err", err.Error())
		// Once the statement went out, the transaction may have committed
		// before the reply was lost, with a token this call does not know.
		// Releasing the owner's keys whatever their token could free a
		// later acquisition of the owner by another process (an old
		// operator resumed after a pause): such a lease is left to its TTL,
		// or taken over by the owner's next attempt (acquiring keys the
		// owner holds renews them, with a new token).
		return nil, 0, err
	}
	if !ok {
		if busy < 1 || int(busy) > len(req.Keys) {
			return nil, 0, l.unavailable("acquire", fmt.Errorf("busy key index %d out of range [1, %d]", busy, len(req.Keys)))
		}
		if replaced != 0 {
			// Not queued, and not to be: the newer request keeps the place.
			return nil, 0, fmt.Errorf("acquire keys %q: %w: a newer request took its place in the queue of key %q", req.Keys, lock.ErrReplaced, req.Keys[busy-1])
		}
		he := &lock.HeldError{
			Key:      req.Keys[busy-1],
			Holder:   busyHolder,
			Fence:    busyFence,
			Holders:  int(count),
			Position: int(position),
			Waiters:  int(queued),
		}
		return nil, time.Duration(ttlMs) * time.Millisecond, he
	}
	if fence <= 0 || fence >= lock.MaxFence {
		return nil, 0, l.unavailable("acquire", fmt.Errorf("fencing token %d out of range (0, %d)", fence, lock.MaxFence))
	}
	// The database's expiry is its clock when the row locks were held + TTL,
	// and that is after start: the lease is valid until start + TTL, less
	// the drift allowance. (The call's duration is already behind start;
	// subtracting it again would shorten every lease by one round trip.)
	expires, validity := l.leaseEnd(start, req.TTL)
	if validity <= 0 {
		// The database holds the lease until start+TTL at the earliest, but
		// the caller would get it with nothing left: give it back (this
		// acquisition only, by its token).
		l.releaseQuietly(ctx, req.Keys, req.Owner, fence)
		return nil, 0, l.unavailable("acquire", fmt.Errorf("the acquisition took %v, leaving no validity of the %v TTL (drift allowance %v)", l.opts.Since(start), req.TTL, drift(req.TTL)))
	}
	lease := lock.NewLease(req, fence, start, expires)
	if v := l.log.V(1); v.Enabled() {
		v.Info("Acquired lease", "keys", req.Keys, "holder", req.Holder, "fence", fence, "validity", validity.String())
	}
	return lease, 0, nil
}

// releaseQuietly releases the owner's keys held with fencing token fence,
// best effort, even when ctx has ended.
func (l *Locker) releaseQuietly(ctx context.Context, keys []string, owner string, fence int64) {
	cctx, cancel := l.cleanupContext(ctx)
	defer cancel()
	if _, err := l.release(cctx, keys, owner, fence); err != nil {
		l.log.V(2).Info("Best-effort release failed", "keys", keys, "err", err.Error())
	}
}
