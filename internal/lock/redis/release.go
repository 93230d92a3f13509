package redis

import (
	"context"
	"fmt"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Release deletes the keys the lease's owner token still holds with the
// lease's fencing token (or a lower one: see heldUpTo in lease.lua), on
// every node, and publishes their release (see lock.Locker): a later
// acquisition of the same owner, with a larger token, is left alone. It returns an error matching
// lock.ErrNotHeld when the owner held none of them; in Redlock mode a majority
// of the nodes must answer, or the error matches lock.ErrQuorum. A semaphore
// lease (lease.Limit > 1) releases the owner's slots and leaves the other
// holders' alone.
func (l *Locker) Release(ctx context.Context, lease *lock.Lease) error {
	if err := l.validateLease(lease); err != nil {
		return err
	}
	vals, errs := answers(l.releaseOnAll(ctx, lease.Keys, lease.Owner, lease.Limit, lease.Fence))
	responded, released := len(vals), 0
	for _, v := range vals {
		if v > 0 {
			released++
		}
	}
	if responded < l.quorum {
		return l.failure(fmt.Sprintf("release keys %q (fencing token %d)", lease.Keys, lease.Fence), responded, errs)
	}
	if released == 0 {
		return fmt.Errorf("release keys %q (fencing token %d): %w: the lease expired or another owner took it", lease.Keys, lease.Fence, lock.ErrNotHeld)
	}
	if v := l.log.V(1); v.Enabled() {
		v.Info("Released lease", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
	}
	return nil
}

// releaseOnAll runs the release script on every node: release.lua for a
// mutex, semrelease.lua for a semaphore slot (limit > 1). In Redlock mode,
// on each node it runs after the owner's late calls there (an acquisition's
// late grant must not outlive the lease's release). Only the owner's
// holdings with a token of at most upTo are released.
func (l *Locker) releaseOnAll(ctx context.Context, keys []string, owner string, limit int, upTo int64) []result[int64] {
	if len(l.nodes) > 1 {
		return chainedFanOut(ctx, l, owner, l.nodes, l.opts.nodeTimeout, func(ctx context.Context, n *node) (int64, error) {
			r := l.releaseOn(ctx, []*node{n}, keys, owner, limit, sameFence(upTo))[0]
			return r.val, r.err
		})
	}
	return l.releaseOn(ctx, l.nodes, keys, owner, limit, sameFence(upTo))
}

// sameFence is a release's bound that is the same on every node.
func sameFence(f int64) func(*node) int64 { return func(*node) int64 { return f } }

// releaseOn runs the release script (as releaseOnAll) on some nodes,
// releasing on node n the owner's holdings with a token of at most upTo(n).
func (l *Locker) releaseOn(ctx context.Context, nodes []*node, keys []string, owner string, limit int, upTo func(*node) int64) []result[int64] {
	rk := l.redisKeys(keys, "lock")
	script, name := releaseScript, "release"
	if limit > 1 {
		rk = l.redisKeys(keys, slotParts...)
		script, name = semReleaseScript, "semaphore release"
	}
	args := l.ownerChannelArgs(scriptOwner(owner, limit), keys)
	return fanOut(ctx, nodes, l.opts.nodeTimeout, func(ctx context.Context, n *node) (int64, error) {
		v, err := run(ctx, script, n.client, name, rk, append(args[:len(args):len(args)], upTo(n))...)
		if err != nil {
			return 0, err
		}
		released, err := asInt(v)
		if err != nil {
			return 0, fmt.Errorf("%s script: %w", name, err)
		}
		return released, nil
	})
}

// Dequeue removes owner from the FIFO queues of keys (a waiter giving up) and,
// when it was at the head of a free key's queue, wakes the next waiter. It is
// not an error to dequeue an owner that is not queued.
func (l *Locker) Dequeue(ctx context.Context, keys []string, owner string) error {
	if err := l.validateKeys("keys", keys); err != nil {
		return err
	}
	if owner == "" {
		return &lock.InvalidRequestError{Field: "owner", Reason: "the owner token of the waiter is required"}
	}
	var res []result[int64]
	if len(l.nodes) > 1 {
		// After the owner's late calls: a late join must not outlive the
		// dequeue.
		res = chainedFanOut(ctx, l, owner, l.nodes, l.opts.nodeTimeout, func(ctx context.Context, n *node) (int64, error) {
			r := l.dequeueOn(ctx, []*node{n}, keys, owner)[0]
			return r.val, r.err
		})
	} else {
		res = l.dequeueOn(ctx, l.nodes, keys, owner)
	}
	vals, errs := answers(res)
	responded := len(vals)
	l.tickets.Delete(owner)
	if responded < l.quorum {
		return l.failure(fmt.Sprintf("dequeue from keys %q", keys), responded, errs)
	}
	return nil
}

func (l *Locker) dequeueOn(ctx context.Context, nodes []*node, keys []string, owner string) []result[int64] {
	rk := l.redisKeys(keys, "lock", "queue", "deadlines", "waiters", "slots")
	args := l.ownerChannelArgs(owner, keys)
	return fanOut(ctx, nodes, l.opts.nodeTimeout, func(ctx context.Context, n *node) (int64, error) {
		v, err := run(ctx, dequeueScript, n.client, "dequeue", rk, args...)
		if err != nil {
			return 0, err
		}
		left, err := asInt(v)
		if err != nil {
			return 0, fmt.Errorf("dequeue script: %w", err)
		}
		return left, nil
	})
}

// leaveQueues removes the owner from the keys' queues on some nodes, best
// effort, even when ctx has ended.
func (l *Locker) leaveQueues(ctx context.Context, nodes []*node, keys []string, owner string) {
	cctx, cancel := l.cleanupContext(ctx)
	defer cancel()
	for _, r := range l.dequeueOn(cctx, nodes, keys, owner) {
		if r.err != nil {
			l.log.V(2).Info("Leaving the queue failed on node; the place expires with the waiter TTL", "node", r.node.name, "keys", keys, "err", r.err.Error())
		}
	}
}

// validateKeys checks a key list given outside a Request.
func (l *Locker) validateKeys(field string, keys []string) error {
	if err := lock.ValidateKeyList(field, keys); err != nil {
		return err
	}
	return l.checkScopes(field, keys)
}

// validateLease checks a lease given to Renew or Release.
func (l *Locker) validateLease(lease *lock.Lease) error {
	if err := lock.ValidateLease(lease); err != nil {
		return err
	}
	return l.checkScopes("lease.keys", lease.Keys)
}
