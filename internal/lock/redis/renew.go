package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Renew extends the lease to ttl from now when its owner token still holds
// every key (see lock.Locker). When the owner lost a key, the keys it still
// held are released and the error matches lock.ErrLost: the lease is gone and
// is never taken again behind the caller's back. When the nodes could not be
// reached the error matches lock.ErrBackendUnavailable (or lock.ErrQuorum in
// Redlock mode): the lease may still be held until its Expires, so the caller
// may try again before then. Redlock needs a majority of the nodes, or for a
// semaphore lease (lease.Limit > 1, which renews the owner's slots) the
// quorum of quorumFor(lease.Limit).
func (l *Locker) Renew(ctx context.Context, lease *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
	if err := validateRenew(lease, ttl); err != nil {
		return nil, err
	}
	start := l.opts.clock.Now()
	script, keys, args := l.renewArgs(lease, ttl)
	res := fanOut(ctx, l.nodes, l.callTimeout(ttl), func(ctx context.Context, n *node) (int64, error) {
		v, err := run(ctx, script, n.client, "renew", keys, args...)
		if err != nil {
			return 0, err
		}
		return asInt(v)
	})
	return l.renewOutcome(ctx, lease, ttl, start, res)
}

// RenewAll renews many leases with one pipelined round trip per node (see
// lock.Locker). Results and errors are by index, with the meaning of Renew.
func (l *Locker) RenewAll(ctx context.Context, leases []*lock.Lease, ttl time.Duration) ([]*lock.Lease, []error) {
	out := make([]*lock.Lease, len(leases))
	errs := make([]error, len(leases))
	var idx []int
	for i, le := range leases {
		if err := validateRenew(le, ttl); err != nil {
			errs[i] = fmt.Errorf("leases[%d]: %w", i, err)
			continue
		}
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return out, errs
	}
	start := l.opts.clock.Now()
	perNode := fanOut(ctx, l.nodes, l.callTimeout(ttl), func(ctx context.Context, n *node) ([]result[int64], error) {
		return l.renewPipeline(ctx, n, leases, idx, ttl), nil
	})
	for k, i := range idx {
		res := make([]result[int64], len(l.nodes))
		for j, pn := range perNode {
			res[j] = pn.val[k]
		}
		out[i], errs[i] = l.renewOutcome(ctx, leases[i], ttl, start, res)
	}
	return out, errs
}

// renewPipeline runs the renew script for every lease in one pipeline. When
// the node lost its script cache it retries the batch once with EVAL (a
// renewal is idempotent).
func (l *Locker) renewPipeline(ctx context.Context, n *node, leases []*lock.Lease, idx []int, ttl time.Duration) []result[int64] {
	exec := func(eval bool) []*goredis.Cmd {
		pipe := n.client.Pipeline()
		cmds := make([]*goredis.Cmd, len(idx))
		for k, i := range idx {
			script, keys, args := l.renewArgs(leases[i], ttl)
			if eval {
				cmds[k] = script.Eval(ctx, pipe, keys, args...)
			} else {
				cmds[k] = script.EvalSha(ctx, pipe, keys, args...)
			}
		}
		_, _ = pipe.Exec(ctx) // per-command errors are read below
		return cmds
	}
	cmds := exec(false)
	for _, c := range cmds {
		if goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			cmds = exec(true)
			break
		}
	}
	out := make([]result[int64], len(cmds))
	for k, c := range cmds {
		out[k].node = n
		v, err := c.Result()
		if err != nil {
			out[k].err = fmt.Errorf("renew script: %w", err)
			continue
		}
		out[k].val, out[k].err = asInt(v)
	}
	return out
}

// renewArgs picks the renew script of the lease (semrenew.lua for a
// semaphore slot) and its keys and arguments.
func (l *Locker) renewArgs(lease *lock.Lease, ttl time.Duration) (*goredis.Script, []string, []any) {
	script, keys := renewScript, l.redisKeys(lease.Keys, "lock", "meta")
	if lease.Limit > 1 {
		script, keys = semRenewScript, l.redisKeys(lease.Keys, slotParts...)
	}
	args := append([]any{lease.Owner, ttl.Milliseconds()}, l.channelArgs(lease.Keys)...)
	return script, keys, args
}

// renewOutcome turns the nodes' renew replies (0: renewed, i > 0: key i lost)
// into the renewed lease or an error.
func (l *Locker) renewOutcome(ctx context.Context, lease *lock.Lease, ttl time.Duration, start time.Time, res []result[int64]) (*lock.Lease, error) {
	renewed, lost := 0, 0
	var errs []error
	for _, r := range res {
		switch {
		case r.err != nil:
			errs = append(errs, r.nodeErr())
		case r.val == 0:
			renewed++
		case r.val > 0 && int(r.val) <= len(lease.Keys):
			lost++
			errs = append(errs, &lock.NodeError{Node: r.node.name, Err: fmt.Errorf("key %q is no longer held by this owner", lease.Keys[r.val-1])})
		default:
			errs = append(errs, &lock.NodeError{Node: r.node.name, Err: fmt.Errorf("renew script: unexpected reply %d", r.val)})
		}
	}
	quorum := l.quorumFor(lease.Limit)
	elapsed := l.opts.clock.Since(start)
	validity := ttl - elapsed - drift(ttl)
	if renewed >= quorum && validity > 0 {
		next := *lease
		next.TTL = ttl
		next.Expires = start.Add(validity)
		if v := l.log.V(4); v.Enabled() {
			v.Info("Renewed lease", "keys", lease.Keys, "fence", lease.Fence, "validity", validity.String())
		}
		return &next, nil
	}
	op := fmt.Sprintf("renew keys %q (fencing token %d)", lease.Keys, lease.Fence)
	if lost > len(l.nodes)-quorum {
		if len(l.nodes) > 1 {
			l.releaseEverywhere(ctx, lease.Keys, lease.Owner, lease.Limit)
		}
		l.log.Info("Lease lost", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
		return nil, fmt.Errorf("%s: %w: %w", op, lock.ErrLost, errors.Join(errs...))
	}
	if renewed >= quorum {
		errs = append(errs, fmt.Errorf("the renewal took %v, leaving no validity of the %v TTL (drift allowance %v)", elapsed, ttl, drift(ttl)))
		return nil, l.failureOf(op, 0, quorum, errs)
	}
	return nil, l.failureOf(op, renewed, quorum, errs)
}

func validateRenew(lease *lock.Lease, ttl time.Duration) error {
	if err := validateLease(lease); err != nil {
		return err
	}
	if ttl < lock.MinTTL {
		return &lock.InvalidRequestError{Field: "ttl", Reason: fmt.Sprintf("%v is below the minimum of %v", ttl, lock.MinTTL)}
	}
	return nil
}
