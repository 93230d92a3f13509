package redis

import (
	"context"
	"fmt"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// TryAcquire makes one attempt to take every key of req (see lock.Locker).
//
// A key is free for req when nobody holds it and its FIFO queue is empty or
// has req's owner at its head: a request without Queue does not jump a
// non-empty queue either (it fails with a *lock.HeldError whose Waiters
// counts the queue). With req.Queue a request that cannot take the keys joins
// (or refreshes its place in) the queue of every key, and must call again
// within the waiter TTL to keep it; so req.Owner is required with Queue.
//
// With req.Limit N > 1 the request takes one of N slots of each key (a
// counting semaphore): a slot is free for it when no mutex holds the key and
// its place in the queue (or the queue's length, when it is not queued) is
// below the number of free slots. A mutex request needs the key free of
// semaphore holders too. The *lock.HeldError of a busy key counts its holders
// and names the oldest.
//
// In Redlock mode the keys must be taken on a quorum of the nodes within the
// lease's validity (TTL minus elapsed time minus drift): a majority for a
// mutex, floor(M*N/(N+1)) + 1 of M nodes for a semaphore of N slots
// (quorumFor); otherwise whatever was taken is released on every node and the
// error matches lock.ErrQuorum (a *QuorumError saying how many nodes agreed
// and were needed), or is a *lock.HeldError when too many nodes said the keys
// are busy for a quorum to be possible.
func (l *Locker) TryAcquire(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	req, err := lock.PrepareRequest(req, true)
	if err != nil {
		return nil, err
	}
	lease, _, err := l.attempt(ctx, req)
	return lease, err
}

// Acquire blocks until it holds every key of req or ctx ends (see lock.Locker).
// It tries once; when the keys are busy it subscribes to their release
// messages and tries again at once (so a release between the first try and
// the subscription is not missed), then after each failed try waits for a
// release message, the holder's remaining TTL or the next backoff step
// (WithBackoff), whichever comes first. With req.Queue it waits in the keys'
// FIFO queues, heartbeating its place at least every third of the waiter TTL,
// and leaves the queues when ctx ends. Errors from Redis are retried too; when
// ctx ends the error wraps both ctx.Err() and the last attempt's error.
func (l *Locker) Acquire(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	req, err := lock.PrepareRequest(req, false)
	if err != nil {
		return nil, err
	}
	var lastErr error
	if ctx.Err() == nil {
		// A free key needs no subscription (a new pub/sub connection per call).
		lease, _, err := l.attempt(ctx, req)
		if err == nil {
			return lease, nil
		}
		lastErr = err
	}
	log := l.log.WithValues("keys", req.Keys, "holder", req.Holder)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var released <-chan string
	if ctx.Err() == nil {
		if l.beforeWatch != nil {
			l.beforeWatch()
		}
		released, err = l.Watch(wctx, req.Keys...)
		if err != nil {
			log.V(2).Info("Watching releases failed; polling only", "err", err.Error())
			released = nil
		}
	}
	b := l.backoff()
	heartbeat := l.opts.waiterTTL / 3
	// The first attempt of the loop comes right after the subscription: a
	// release published before it was active is seen by this attempt.
	for ctx.Err() == nil {
		lease, hint, err := l.attempt(ctx, req)
		if err == nil {
			return lease, nil
		}
		lastErr = err
		d := b.Step()
		if b.Cap > 0 && d > b.Cap {
			d = b.Cap
		}
		if hint > 0 && hint+time.Millisecond < d {
			d = hint + time.Millisecond
		}
		if req.Queue && d > heartbeat {
			d = heartbeat
		}
		if v := log.V(4); v.Enabled() {
			v.Info("Waiting for lease", "wait", d.String(), "err", err.Error())
		}
		timer, stop := l.newTimer(d)
		select {
		case <-ctx.Done():
		case _, ok := <-released:
			if !ok {
				released = nil
			}
			b = l.backoff()
		case <-timer:
		}
		stop()
	}
	if req.Queue {
		cctx, ccancel := l.cleanupContext(ctx)
		if err := l.Dequeue(cctx, req.Keys, req.Owner); err != nil {
			log.V(2).Info("Leaving the queue failed; the place expires with the waiter TTL", "err", err.Error())
		}
		ccancel()
	}
	if lastErr == nil {
		return nil, fmt.Errorf("acquire keys %q: %w", req.Keys, ctx.Err())
	}
	return nil, fmt.Errorf("acquire keys %q: %w; last attempt: %w", req.Keys, ctx.Err(), lastErr)
}

type acquireReply struct {
	ok        bool
	fence     int64
	held      *lock.HeldError
	holderTTL time.Duration
	ticket    int64
}

func (l *Locker) acquireOn(ctx context.Context, n *node, req lock.Request, ticket, proposal int64) (acquireReply, error) {
	keys := append(l.redisKeys(req.Keys, allParts...), l.ticketKey())
	join := "0"
	if req.Queue {
		join = "1"
	}
	script, name := acquireScript, "acquire"
	args := []any{req.Owner, req.TTL.Milliseconds(), req.Holder, join, l.opts.waiterTTL.Milliseconds(), ticket, lock.MaxFence, proposal}
	if req.Holders() > 1 {
		script, name = semAcquireScript, "semaphore acquire"
		args = append(args, req.Holders())
	}
	v, err := run(ctx, script, n.client, name, keys, args...)
	if err != nil {
		return acquireReply{}, err
	}
	s, err := asSlice(v, 2)
	if err != nil {
		return acquireReply{}, fmt.Errorf("%s script: %w", name, err)
	}
	d := decoder{s: s}
	if d.int(0) == 1 {
		fence := d.int(1)
		if d.err == nil && (fence <= 0 || fence >= lock.MaxFence) {
			d.err = fmt.Errorf("fencing token %d out of range (0, %d)", fence, lock.MaxFence)
		}
		if d.err != nil {
			return acquireReply{}, fmt.Errorf("%s script: %w", name, d.err)
		}
		return acquireReply{ok: true, fence: fence}, nil
	}
	if d.err == nil && len(s) < 9 {
		d.err = fmt.Errorf("unexpected reply %v: want 9 elements", s)
	}
	idx := d.int(1)
	if d.err == nil && (idx < 1 || int(idx) > len(req.Keys)) {
		d.err = fmt.Errorf("busy key index %d out of range [1, %d]", idx, len(req.Keys))
	}
	if d.err != nil {
		return acquireReply{}, fmt.Errorf("%s script: %w", name, d.err)
	}
	r := acquireReply{
		held: &lock.HeldError{
			Key:      req.Keys[idx-1],
			Holder:   d.str(2),
			Fence:    d.int(3),
			Position: int(d.int(4)),
			Waiters:  int(d.int(5)),
			Holders:  int(d.int(8)),
		},
		holderTTL: time.Duration(d.int(6)) * time.Millisecond,
		ticket:    d.int(7),
	}
	if d.err != nil {
		return acquireReply{}, fmt.Errorf("%s script: %w", name, d.err)
	}
	return r, nil
}

// The Redlock fence proposal (see acquire.lua and docs/safety.md, "Fencing
// tokens"). Every node issues max(counter + 1, its TIME, min(proposal, its
// TIME + fenceWindow)), so when the client proposes the same token to every
// node, ahead of the nodes' clocks by the time the scripts run, the nodes
// agree and no fence write-back is needed. The cap keeps a client clock that
// is far ahead (or behind) from moving tokens further than fenceWindow ahead
// of a node's own clock; then the nodes disagree and writeBack makes them
// agree, as without a proposal.
const (
	// fenceLead is how far ahead of the client clock the proposal is: more
	// than the time from reading the clock to the script running on the
	// slowest node, plus the clock offset between client and nodes.
	fenceLead = 10 * time.Millisecond
	// fenceWindow is window in acquire.lua: how far ahead of a node's clock
	// a proposal may be, and where a key without a counter starts.
	fenceWindow = 20 * time.Millisecond
)

// fenceProposal is the token proposed to every Redlock node for an attempt
// that started at start. It is always positive, even from a clock that is
// unusable (before 1970 or past MaxFence): a proposal, whatever its value,
// makes a node start a key without a counter at its clock + fenceWindow,
// above the tokens it capped at that bound before an empty restart.
func fenceProposal(start time.Time) int64 {
	return min(max(start.UnixMicro()+fenceLead.Microseconds(), 1), lock.MaxFence-1)
}

// attempt is one acquisition on every node. It returns the lease, or a hint
// of when the busy holder's lease ends (0 when unknown) and the error.
func (l *Locker) attempt(ctx context.Context, req lock.Request) (*lock.Lease, time.Duration, error) {
	redlock := len(l.nodes) > 1
	var ticket int64
	if redlock && req.Queue {
		if v, ok := l.tickets.Load(req.Owner); ok {
			ticket = v.(int64)
		}
	}
	start := l.opts.clock.Now()
	var proposal int64
	if redlock {
		proposal = fenceProposal(start)
	}
	timeout := l.callTimeout(req.TTL)
	res := fanOut(ctx, l.nodes, timeout, func(ctx context.Context, n *node) (acquireReply, error) {
		return l.acquireOn(ctx, n, req, ticket, proposal)
	})
	var (
		acquired   []result[acquireReply]
		busyNodes  []*node
		fence      int64
		busy       []*lock.HeldError
		errs       []error
		hint       time.Duration
		maxTicket  int64
		nodeFailed bool
	)
	for _, r := range res {
		switch {
		case r.err != nil:
			nodeFailed = true
			errs = append(errs, r.nodeErr())
			l.log.V(2).Info("Acquire failed on node", "node", r.node.name, "keys", req.Keys, "err", r.err.Error())
		case r.val.ok:
			acquired = append(acquired, r)
			fence = max(fence, r.val.fence)
		default:
			busy = append(busy, r.val.held)
			busyNodes = append(busyNodes, r.node)
			errs = append(errs, &lock.NodeError{Node: r.node.name, Err: r.val.held})
			if t := r.val.holderTTL; t > 0 && (hint == 0 || t < hint) {
				hint = t
			}
			maxTicket = max(maxTicket, r.val.ticket)
		}
	}
	if redlock && req.Queue && maxTicket > 0 {
		l.tickets.Store(req.Owner, maxTicket)
	}
	quorum := l.quorumFor(req.Limit)
	agreed := len(acquired)
	if redlock && agreed >= quorum {
		agreed = l.writeBack(ctx, req, acquired, fence, timeout)
	}
	elapsed := l.opts.clock.Since(start)
	validity := req.TTL - elapsed - drift(req.TTL)
	if agreed >= quorum && validity > 0 {
		l.tickets.Delete(req.Owner)
		if req.Queue && req.Holders() > 1 && len(busyNodes) > 0 {
			// The nodes that refused keep the owner queued: there it would
			// hold a place ahead of the next waiters, and a semaphore's
			// quorum may need those nodes.
			l.leaveQueues(ctx, busyNodes, req.Keys, req.Owner)
		}
		lease := &lock.Lease{
			Keys:     req.Keys,
			Owner:    req.Owner,
			Holder:   req.Holder,
			Fence:    fence,
			TTL:      req.TTL,
			Acquired: start,
			Expires:  start.Add(validity),
			Limit:    req.Limit,
		}
		if v := l.log.V(1); v.Enabled() {
			v.Info("Acquired lease", "keys", req.Keys, "holder", req.Holder, "fence", fence, "validity", validity.String())
		}
		return lease, 0, nil
	}

	// Not acquired: undo whatever this attempt took (a node that failed may
	// have run the script before the reply was lost).
	if len(acquired) > 0 || nodeFailed {
		l.releaseEverywhere(ctx, req.Keys, req.Owner, req.Limit)
	}
	op := fmt.Sprintf("acquire keys %q", req.Keys)
	if req.Holders() > 1 && redlock {
		op = fmt.Sprintf("acquire a slot of %d on keys %q (a semaphore needs %d of %d nodes, more than a majority)", req.Holders(), req.Keys, quorum, len(l.nodes))
	}
	if agreed >= quorum {
		slow := fmt.Errorf("the acquisition took %v, leaving no validity of the %v TTL (drift allowance %v)", elapsed, req.TTL, drift(req.TTL))
		return nil, hint, l.failureOf(op, 0, quorum, append(errs, slow))
	}
	if len(busy) > len(l.nodes)-quorum {
		return nil, hint, pickHeld(busy)
	}
	return nil, hint, l.failureOf(op, len(acquired), quorum, errs)
}

// pickHeld chooses the most telling of the nodes' busy answers: one that names a holder.
func pickHeld(busy []*lock.HeldError) *lock.HeldError {
	for _, h := range busy {
		if h.Holder != "" {
			return h
		}
	}
	return busy[0]
}

// writeBack raises the fence counters to fence on the nodes where the lease
// was taken with a lower token, and returns how many nodes now hold the lease
// with counters at fence or above.
func (l *Locker) writeBack(ctx context.Context, req lock.Request, acquired []result[acquireReply], fence int64, timeout time.Duration) int {
	done := 0
	var behind []*node
	for _, r := range acquired {
		if r.val.fence >= fence {
			done++
		} else {
			behind = append(behind, r.node)
		}
	}
	if len(behind) == 0 {
		return done
	}
	keys := l.redisKeys(req.Keys, "lock", "meta", "fence")
	script, name := raiseScript, "raise"
	if req.Holders() > 1 {
		keys = l.redisKeys(req.Keys, "fence", "slots", "slotfences", "slotmeta")
		script, name = semRaiseScript, "semaphore raise"
	}
	res := fanOut(ctx, behind, timeout, func(ctx context.Context, n *node) (int64, error) {
		v, err := run(ctx, script, n.client, name, keys, fence, req.Owner)
		if err != nil {
			return 0, err
		}
		return asInt(v)
	})
	for _, r := range res {
		if r.err != nil {
			l.log.V(2).Info("Fence write-back failed on node", "node", r.node.name, "keys", req.Keys, "fence", fence, "err", r.err.Error())
			continue
		}
		done++
	}
	return done
}

// releaseEverywhere releases the owner's keys (its slots when limit > 1) on
// every node, best effort, even when ctx has ended.
func (l *Locker) releaseEverywhere(ctx context.Context, keys []string, owner string, limit int) {
	cctx, cancel := l.cleanupContext(ctx)
	defer cancel()
	for _, r := range l.releaseOnAll(cctx, keys, owner, limit) {
		if r.err != nil {
			l.log.V(2).Info("Best-effort release failed on node", "node", r.node.name, "keys", keys, "err", r.err.Error())
		}
	}
}
