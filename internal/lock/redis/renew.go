package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
// quorum of quorumFor(lease.Limit). In Sentinel mode a renewal that fewer
// than Config.MinReplicas replicas acknowledged fails with a *ReplicaError,
// which matches lock.ErrBackendUnavailable: the lease stays valid until its
// previous Expires, which is what a failover preserves (see replicas.go).
func (l *Locker) Renew(ctx context.Context, lease *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
	if err := l.validateRenew(lease, ttl); err != nil {
		return nil, err
	}
	start := l.opts.Clock.Now()
	c := l.renewCall(lease, ttl)
	res := fanOut(ctx, l.nodes, l.callTimeout(ttl)+l.replicaWait(ttl), func(ctx context.Context, n *node) (int64, error) {
		v, acked, err := l.runAcked(ctx, c.script, n.client, "renew", ttl, renewed, c.keys, c.args...)
		if err != nil {
			return 0, err
		}
		return renewedIfAcked(lease, v, acked)
	})
	elapsed := l.opts.Clock.Since(start)
	next, err := l.renewOutcome(lease, ttl, start, elapsed, res)
	if errors.Is(err, lock.ErrLost) && len(l.nodes) > 1 {
		l.releaseEverywhere(ctx, lease.Keys, lease.Owner, lease.Limit, lease.Fence)
	}
	return next, err
}

// renewed tells a renew script's reply of a renewal (0) from a lost key.
func renewed(v any) bool {
	n, err := asInt(v)
	return err == nil && n == 0
}

// renewedIfAcked decodes a renew script's reply; a renewal (0) that fewer
// replicas acknowledged than required is a *ReplicaError instead (see
// replicas.go): the caller keeps the lease it had, whose Expires the
// replicas do cover, and is not given one that a failover would cut short.
// A lost key is reported as lost whatever the replicas acknowledged.
func renewedIfAcked(lease *lock.Lease, v any, acked acks) (int64, error) {
	n, err := asInt(v)
	if err != nil || n != 0 {
		return n, err
	}
	if err := acked.check(fmt.Sprintf("renew keys %q (fencing token %d)", lease.Keys, lease.Fence)); err != nil {
		return 0, err
	}
	return 0, nil
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
		if err := l.validateRenew(le, ttl); err != nil {
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
	start := l.opts.Clock.Now()
	// Each pipeline of renewChunk commands has the per-node timeout of a
	// renewal; the batch as a whole is bounded by a quarter of the TTL.
	// In Sentinel mode every pipeline ends with a WAIT for the replicas,
	// which both bounds include.
	ackWait := l.replicaWait(ttl)
	perNode := fanOut(ctx, l.nodes, ttl/4+ackWait, func(ctx context.Context, n *node) ([]result[int64], error) {
		return l.renewPipeline(ctx, n, leases, idx, calls, ttl, l.callTimeout(ttl)+ackWait), nil
	})
	elapsed := l.opts.Clock.Since(start)

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
		l.releaseLost(ttl, leases, idx, lost, perNode)
	}
	return out, errs
}

// scriptCall is one script invocation: the script, its keys and arguments.
type scriptCall struct {
	script *goredis.Script
	keys   []string
	args   []any
}

// renewPipeline runs the renew script of every lease (calls[k] renews
// leases[idx[k]]) on one node, pipelined (see pipelined; with the WAIT of
// leases of the given TTL in Sentinel mode), and decodes the replies.
func (l *Locker) renewPipeline(ctx context.Context, n *node, leases []*lock.Lease, idx []int, calls []scriptCall, ttl, timeout time.Duration) []result[int64] {
	out := make([]result[int64], len(calls))
	l.pipelined(ctx, n, calls, ttl, timeout, renewed, func(k int, v any, acked acks, err error) {
		out[k].node = n
		if err != nil {
			out[k].err = fmt.Errorf("renew script: %w", err)
			return
		}
		out[k].val, out[k].err = renewedIfAcked(leases[idx[k]], v, acked)
	})
	return out
}

// Pipelining of large batches (RenewAll, the release of lost leases).
const (
	// pipelineChunk is how many commands go in one pipeline: a batch of
	// thousands of leases is sent as several pipelines, each answered
	// within the per-node timeout, instead of one that no timeout fits.
	pipelineChunk = 512
	// chunksInFlight is how many pipelines of one batch are in flight to
	// one node at once (on as many connections): the node runs one while
	// the next is encoded and sent.
	chunksInFlight = 2
)

// pipelined runs calls on node n in pipelines of pipelineChunk commands,
// each under timeout (the whole under ctx), and hands every reply or error
// to done(index, value, acks, err), from one goroutine per pipeline in
// flight. With waitTTL > 0 and replicas required (Sentinel mode), each
// pipeline runs on a connection of its own, and when needsAck says one of its
// replies needs the replicas' acknowledgement (a renewal), it is followed on
// that connection by the WAIT of a lease of that TTL (waitAcks), whose answer
// acks is for every command of the pipeline; otherwise acks is zero.
// After a pipeline got no answer at all (a timeout or connection error on
// its first command), the calls not sent yet fail with the same error: a
// node that does not answer costs one timeout, not one per pipeline. When the node lost its script
// cache, the scripts are loaded once and only the commands that failed for
// it are sent again, by SHA (the scripts are idempotent).
func (l *Locker) pipelined(ctx context.Context, n *node, calls []scriptCall, waitTTL, timeout time.Duration, needsAck func(v any) bool, done func(k int, v any, acked acks, err error)) {
	var (
		mu      sync.Mutex
		failure error
	)
	runChunk := func(lo, hi int) {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		var on scriptPipeliner = n.client
		var conn *goredis.Conn
		if waitTTL > 0 && l.replicas > 0 && needsAck != nil {
			// WAIT counts the writes of the connection it is sent on.
			conn = n.client.Conn()
			defer conn.Close()
			on = conn
		}
		chunk := calls[lo:hi]
		cmds := make([]*goredis.Cmd, len(chunk))
		pipe := on.Pipeline()
		for k, c := range chunk {
			cmds[k] = c.script.EvalSha(cctx, pipe, c.keys, c.args...)
		}
		_, _ = pipe.Exec(cctx) // per-command errors are read below
		l.resendWithoutScripts(cctx, n.name, on, chunk, cmds)
		var a acks
		if conn != nil {
			for _, c := range cmds {
				if v, err := c.Result(); err == nil && needsAck(v) {
					a = l.waitAcks(cctx, conn, waitTTL)
					break
				}
			}
		}
		for k, c := range cmds {
			v, err := c.Result()
			done(lo+k, v, a, err)
		}
		// No reply at all (not even to the first command): the node is
		// down or stalled. A pipeline cut short by its timeout after
		// some replies came from a node that is alive, only slow.
		if err := cmds[0].Err(); err != nil && !isRedisError(err) {
			mu.Lock()
			if failure == nil {
				failure = err
			}
			mu.Unlock()
		}
	}
	if len(calls) <= pipelineChunk {
		if len(calls) > 0 {
			runChunk(0, len(calls))
		}
		return
	}
	slots := make(chan struct{}, chunksInFlight)
	var wg sync.WaitGroup
	for lo := 0; lo < len(calls); lo += pipelineChunk {
		hi := min(lo+pipelineChunk, len(calls))
		slots <- struct{}{}
		mu.Lock()
		err := failure
		mu.Unlock()
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			<-slots
			for k := lo; k < len(calls); k++ {
				done(k, nil, acks{}, err)
			}
			break
		}
		wg.Go(func() {
			defer func() { <-slots }()
			runChunk(lo, hi)
		})
	}
	wg.Wait()
}

// isRedisError tells a reply of the server (a script error, NOSCRIPT) from
// a failure to get a reply (timeout, connection error).
func isRedisError(err error) bool {
	var re goredis.Error
	return errors.As(err, &re)
}

// resendWithoutScripts handles the commands of a pipeline that failed with
// NOSCRIPT (the node restarted or its script cache was flushed): it loads
// their scripts with SCRIPT LOAD and sends those commands again with EVALSHA,
// replacing them in cmds. Only when the scripts cannot be loaded are they
// sent with EVAL, script text included. The scripts must be idempotent.
// on is the node's client, or the connection of it they were sent on.
func (l *Locker) resendWithoutScripts(ctx context.Context, node string, on scriptPipeliner, calls []scriptCall, cmds []*goredis.Cmd) {
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
		if err := s.Load(ctx, on).Err(); err != nil {
			loadErr = err
			break
		}
	}
	if loadErr != nil {
		l.log.V(2).Info("Loading the scripts failed on node; sending them with every call", "node", node, "err", loadErr.Error())
	}
	pipe := on.Pipeline()
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
	script, keys := renewScript, l.redisKeys(lease.Keys, renewParts...)
	if lease.Limit > 1 {
		script, keys = semRenewScript, l.redisKeys(lease.Keys, semRenewParts...)
	}
	args := make([]any, 0, 3+2*len(lease.Keys))
	args = append(args, scriptOwner(lease.Owner, lease.Limit), ttl.Milliseconds())
	for _, k := range lease.Keys {
		args = append(args, l.channel(k), k)
	}
	// This acquisition's, not a later one's of the same owner (heldUpTo).
	args = append(args, lease.Fence)
	return scriptCall{script: script, keys: keys, args: args}
}

// renewOutcome turns the nodes' renew replies (0: renewed, i > 0: key i lost,
// i < 0: the holding of key -i preempted) into the renewed lease or an
// error. elapsed is the time from start (when the renewal was sent) until
// the replies were in.
func (l *Locker) renewOutcome(lease *lock.Lease, ttl time.Duration, start time.Time, elapsed time.Duration, res []result[int64]) (*lock.Lease, error) {
	renewed, lost, preempted := 0, 0, 0
	stoppedOn := ""
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
		case r.val < 0 && int(-r.val) <= len(lease.Keys):
			preempted++
			if stoppedOn == "" {
				stoppedOn = lease.Keys[-r.val-1]
			}
			errs = append(errs, &lock.NodeError{Node: r.node.name, Err: fmt.Errorf("a newer request waits for key %q and stopped this lease", lease.Keys[-r.val-1])})
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
	if preempted > 0 && renewed+preempted >= quorum {
		// The preemption is why no quorum renewed it: the lease is left as
		// it was, valid until its Expires, never shortened.
		return nil, fmt.Errorf("%s: %w: a newer request waits for key %q and stopped this lease; it stays valid until %s, release it once the work has stopped: %w",
			op, lock.ErrPreempted, stoppedOn, lease.Expires.Format(time.RFC3339Nano), errors.Join(errs...))
	}
	if renewed >= quorum {
		errs = append(errs, fmt.Errorf("the renewal took %v, leaving no validity of the %v TTL (drift allowance %v)", elapsed, ttl, drift(ttl)))
	}
	return nil, l.failureOf(op, renewed, quorum, errs)
}

// releaseLost releases, in the background, the keys of the leases RenewAll
// found lost (leases[idx[k]] for k in lost) on every node where the renew
// script did not already do it (it did where it answered that a key was
// lost): pipelined per node (pipelined), each pipeline bounded by the node
// timeout and the whole by a quarter of the TTL.
func (l *Locker) releaseLost(ttl time.Duration, leases []*lock.Lease, idx, lost []int, perNode []result[[]result[int64]]) {
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
	// The clean-up of a batch is bounded like the renewal of one: a
	// quarter of the TTL, and the node timeout per pipeline. It runs as a
	// tracked background call: Close cancels it and waits for it.
	cctx, cancel := l.bg.cleanupContext(max(ttl/4, l.opts.nodeTimeout))
	started := l.bg.spawn(func() {
		defer cancel()
		nodes := make([]*node, len(work))
		for i, w := range work {
			nodes[i] = w.node
		}
		fanOut(cctx, nodes, max(ttl/4, l.opts.nodeTimeout), func(ctx context.Context, n *node) (struct{}, error) {
			var calls []scriptCall
			for _, w := range work {
				if w.node == n {
					calls = w.calls
				}
			}
			var (
				mu      sync.Mutex
				failed  error
				failedN int
			)
			l.pipelined(ctx, n, calls, 0, l.opts.nodeTimeout, nil, func(_ int, _ any, _ acks, err error) {
				// One goroutine per pipeline in flight: count under the lock.
				if err != nil {
					mu.Lock()
					failed = err
					failedN++
					mu.Unlock()
				}
			})
			if failed != nil {
				l.log.V(2).Info("Best-effort release of lost leases failed on node; their keys expire with the TTL", "node", n.name, "failed", failedN, "leases", len(calls), "err", failed.Error())
			}
			return struct{}{}, nil
		})
	})
	if !started {
		cancel() // closed: the keys expire with their TTL
	}
}

// releaseCall is the release script call of a lease: release.lua for a
// mutex, semrelease.lua for a semaphore slot.
func (l *Locker) releaseCall(lease *lock.Lease) scriptCall {
	script, keys := releaseScript, l.redisKeys(lease.Keys, "lock")
	if lease.Limit > 1 {
		script, keys = semReleaseScript, l.redisKeys(lease.Keys, slotParts...)
	}
	args := append(l.ownerChannelArgs(scriptOwner(lease.Owner, lease.Limit), lease.Keys), lease.Fence)
	return scriptCall{script: script, keys: keys, args: args}
}

func (l *Locker) validateRenew(lease *lock.Lease, ttl time.Duration) error {
	if err := l.validateLease(lease); err != nil {
		return err
	}
	return lock.ValidateTTL(ttl)
}
