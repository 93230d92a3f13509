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
	c := l.renewCall(lease, ttl)
	res := fanOut(ctx, l.nodes, l.callTimeout(ttl), func(ctx context.Context, n *node) (int64, error) {
		v, err := run(ctx, c.script, n.client, "renew", c.keys, c.args...)
		if err != nil {
			return 0, err
		}
		return asInt(v)
	})
	elapsed := l.opts.clock.Since(start)
	next, err := l.renewOutcome(lease, ttl, start, elapsed, res)
	if errors.Is(err, lock.ErrLost) && len(l.nodes) > 1 {
		l.releaseEverywhere(ctx, lease.Keys, lease.Owner, lease.Limit)
	}
	return next, err
}

// RenewAll renews many leases with one pipelined round trip per node (see
// lock.Locker). Results and errors are by index, with the meaning of Renew.
//
// Every outcome is decided from the nodes' replies and one elapsed time,
// measured when the last reply is in. In Redlock mode the leases found lost
// are then released, batched per node, in the background (bounded by the
// node timeout): a node that does not answer delays neither the other
// results nor their validity.
func (l *Locker) RenewAll(ctx context.Context, leases []*lock.Lease, ttl time.Duration) ([]*lock.Lease, []error) {
	out := make([]*lock.Lease, len(leases))
	errs := make([]error, len(leases))
	idx := make([]int, 0, len(leases))
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
	// The keys and arguments of each lease, built once for all nodes.
	calls := make([]scriptCall, len(idx))
	for k, i := range idx {
		calls[k] = l.renewCall(leases[i], ttl)
	}
	start := l.opts.clock.Now()
	perNode := fanOut(ctx, l.nodes, l.callTimeout(ttl), func(ctx context.Context, n *node) ([]result[int64], error) {
		return l.renewPipeline(ctx, n, calls), nil
	})
	elapsed := l.opts.clock.Since(start)

	res := make([]result[int64], len(l.nodes))
	var lost []int // positions in idx of the leases to release
	for k, i := range idx {
		for j, pn := range perNode {
			res[j] = pn.val[k]
		}
		out[i], errs[i] = l.renewOutcome(leases[i], ttl, start, elapsed, res)
		if errs[i] != nil && len(l.nodes) > 1 && errors.Is(errs[i], lock.ErrLost) {
			lost = append(lost, k)
		}
	}
	if len(lost) > 0 {
		l.releaseLost(ctx, leases, idx, lost, perNode)
	}
	return out, errs
}

// scriptCall is one script invocation: the script, its keys and arguments.
type scriptCall struct {
	script *goredis.Script
	keys   []string
	args   []any
}

// renewPipeline runs the renew script for every lease in one pipeline. When
// the node lost its script cache, it loads the scripts once and sends again,
// by SHA, only the renewals that failed for that (a renewal is idempotent).
func (l *Locker) renewPipeline(ctx context.Context, n *node, calls []scriptCall) []result[int64] {
	cmds := make([]*goredis.Cmd, len(calls))
	pipe := n.client.Pipeline()
	for k, c := range calls {
		cmds[k] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // per-command errors are read below
	l.resendWithoutScripts(ctx, n, calls, cmds)
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

// resendWithoutScripts handles the commands of a pipeline that failed with
// NOSCRIPT (the node restarted or its script cache was flushed): it loads
// their scripts with SCRIPT LOAD and sends those commands again with EVALSHA,
// replacing them in cmds. Only when the scripts cannot be loaded are they
// sent with EVAL, script text included. The scripts must be idempotent.
func (l *Locker) resendWithoutScripts(ctx context.Context, n *node, calls []scriptCall, cmds []*goredis.Cmd) {
	var failed []int
	for k, c := range cmds {
		if goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			failed = append(failed, k)
		}
	}
	if len(failed) == 0 {
		return
	}
	var scripts []*goredis.Script
	for _, k := range failed {
		s := calls[k].script
		if !containsScript(scripts, s) {
			scripts = append(scripts, s)
		}
	}
	// Not in a pipeline: Script.Load records the SHA the server returns,
	// which a pipelined command does not have yet.
	var loadErr error
	for _, s := range scripts {
		if err := s.Load(ctx, n.client).Err(); err != nil {
			loadErr = err
			break
		}
	}
	if loadErr != nil {
		l.log.V(2).Info("Loading the scripts failed on node; sending them with every call", "node", n.name, "err", loadErr.Error())
	}
	pipe := n.client.Pipeline()
	for _, k := range failed {
		c := calls[k]
		if loadErr != nil {
			cmds[k] = c.script.Eval(ctx, pipe, c.keys, c.args...)
		} else {
			cmds[k] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
	}
	_, _ = pipe.Exec(ctx)
}

func containsScript(scripts []*goredis.Script, s *goredis.Script) bool {
	for _, x := range scripts {
		if x == s {
			return true
		}
	}
	return false
}

// renewCall picks the renew script of the lease (semrenew.lua for a
// semaphore slot) and its keys and arguments.
func (l *Locker) renewCall(lease *lock.Lease, ttl time.Duration) scriptCall {
	script, keys := renewScript, l.redisKeys(lease.Keys, "lock", "meta")
	if lease.Limit > 1 {
		script, keys = semRenewScript, l.redisKeys(lease.Keys, slotParts...)
	}
	args := make([]any, 0, 2+2*len(lease.Keys))
	args = append(args, lease.Owner, ttl.Milliseconds())
	for _, k := range lease.Keys {
		args = append(args, l.channel(k), k)
	}
	return scriptCall{script: script, keys: keys, args: args}
}

// renewOutcome turns the nodes' renew replies (0: renewed, i > 0: key i lost)
// into the renewed lease or an error. elapsed is the time from start (when
// the renewal was sent) until the replies were in.
func (l *Locker) renewOutcome(lease *lock.Lease, ttl time.Duration, start time.Time, elapsed time.Duration, res []result[int64]) (*lock.Lease, error) {
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
		l.log.Info("Lease lost", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
		return nil, fmt.Errorf("%s: %w: %w", op, lock.ErrLost, errors.Join(errs...))
	}
	if renewed >= quorum {
		errs = append(errs, fmt.Errorf("the renewal took %v, leaving no validity of the %v TTL (drift allowance %v)", elapsed, ttl, drift(ttl)))
	}
	return nil, l.failureOf(op, renewed, quorum, errs)
}

// releaseLost releases, in the background, the keys of the leases RenewAll
// found lost (leases[idx[k]] for k in lost) on every node where the renew
// script did not already do it (it did where it answered that a key was
// lost): one pipeline per node, bounded by the node timeout.
func (l *Locker) releaseLost(ctx context.Context, leases []*lock.Lease, idx, lost []int, perNode []result[[]result[int64]]) {
	type release struct {
		node  *node
		calls []scriptCall
	}
	var work []release
	for _, pn := range perNode {
		var calls []scriptCall
		for _, k := range lost {
			if r := pn.val[k]; r.err == nil && r.val > 0 {
				continue // released by the renew script
			}
			calls = append(calls, l.releaseCall(leases[idx[k]]))
		}
		if len(calls) > 0 {
			work = append(work, release{node: pn.node, calls: calls})
		}
	}
	if len(work) == 0 {
		return
	}
	cctx, cancel := l.cleanupContext(ctx)
	go func() {
		defer cancel()
		nodes := make([]*node, len(work))
		for i, w := range work {
			nodes[i] = w.node
		}
		fanOut(cctx, nodes, l.opts.nodeTimeout, func(ctx context.Context, n *node) (struct{}, error) {
			var calls []scriptCall
			for _, w := range work {
				if w.node == n {
					calls = w.calls
				}
			}
			pipe := n.client.Pipeline()
			cmds := make([]*goredis.Cmd, len(calls))
			for k, c := range calls {
				cmds[k] = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
			}
			_, _ = pipe.Exec(ctx)
			l.resendWithoutScripts(ctx, n, calls, cmds)
			for _, c := range cmds {
				if err := c.Err(); err != nil {
					l.log.V(2).Info("Best-effort release of lost leases failed on node; their keys expire with the TTL", "node", n.name, "leases", len(calls), "err", err.Error())
					break
				}
			}
			return struct{}{}, nil
		})
	}()
}

// releaseCall is the release script call of a lease: release.lua for a
// mutex, semrelease.lua for a semaphore slot.
func (l *Locker) releaseCall(lease *lock.Lease) scriptCall {
	script, keys := releaseScript, l.redisKeys(lease.Keys, "lock", "meta")
	if lease.Limit > 1 {
		script, keys = semReleaseScript, l.redisKeys(lease.Keys, slotParts...)
	}
	args := append([]any{lease.Owner}, l.channelArgs(lease.Keys)...)
	return scriptCall{script: script, keys: keys, args: args}
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
