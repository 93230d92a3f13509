package redis

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// wait is Acquire (lock.Acquisitions) once req is prepared: it blocks until it
// holds every key of req or ctx ends (see lock.Locker).
// It tries once; when the keys are busy it subscribes to their release
// messages and tries again at once (so a release between the first try and
// the subscription is not missed), then after each failed try waits for a
// release message, the holder's remaining TTL or the next backoff step
// (WithBackoff), whichever comes first. With req.Queue it waits in the keys'
// FIFO queues, heartbeating its place at least every third of the waiter TTL,
// and leaves the queues when ctx ends. Errors from Redis are retried too; when
// ctx ends the error wraps both ctx.Err() and the last attempt's error.
func (l *Locker) wait(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	// A subscription is a new pub/sub connection per call: only for busy keys.
	return lock.AcquireOnReleases(ctx, &l.opts.Options, req,
		func(ctx context.Context) (*lock.Lease, time.Duration, error) { return l.attempt(ctx, req) },
		func(ctx context.Context, keys ...string) (<-chan string, error) {
			if l.beforeWatch != nil {
				l.beforeWatch()
			}
			return l.Watch(ctx, keys...)
		},
		l.Dequeue)
}

// keepsPlace tells whether semacquire.lua keeps the owner's place in the
// queues of a node that grants req, sent with ticket: in Redlock mode, for a
// semaphore waiter the client holds a ticket for (semacquire.lua's
// keepPlace). A grant that the attempt releases, lacking a quorum, then
// leaves the waiters behind it where they were; the owner leaves the queues
// once it holds the lease.
func keepsPlace(req lock.Request, ticket int64) bool {
	return req.Queue && req.Holders() > 1 && ticket > 0
}

type acquireReply struct {
	ok        bool
	fence     int64
	held      *lock.HeldError
	holderTTL time.Duration
	ticket    int64
	// replaced names the key from whose queue a newer request with Replace
	// dropped the owner (the script's {2, key index}); "" otherwise.
	replaced string
}

// policyArg is acquire.lua's ARGV 4 for req: whether it joins the queues,
// and with which queue rule.
func policyArg(req lock.Request) string {
	switch {
	case req.Preempt:
		return "3"
	case req.Replace:
		return "2"
	case req.Queue:
		return "1"
	}
	return "0"
}

func (l *Locker) acquireOn(ctx context.Context, n *node, req lock.Request, ticket, proposal int64) (acquireReply, error) {
	keys := append(l.redisKeysCap(req.Keys, 1, acquireParts...), l.ticketFor(req.Keys))
	join := policyArg(req)
	script, name := acquireScript, "acquire"
	args := []any{scriptOwner(req.Owner, req.Holders()), req.TTL.Milliseconds(), req.Holder, join, l.waiterTTLArg, ticket, maxTokenArg, proposal}
	switch {
	case req.Holders() > 1:
		script, name = semAcquireScript, "semaphore acquire"
		args = append(args, req.Holders())
	case !req.Queue && ticket == 0 && proposal == 0:
		// ARGV 4 to 8 are acquire.lua's defaults: left out, as every
		// argument sent is parsed on every acquisition.
		args = args[:3]
	}
	if req.Boost > 0 || req.Slots() > 1 {
		// The head start (ARGV 9, or 10 after a semaphore's limit): sent
		// only when there is one, or a weight after it, so a request without
		// Boost costs what it did.
		args = append(args, req.Boost.Microseconds())
	}
	if req.Slots() > 1 {
		// A semaphore's weight (ARGV 11): sent only above 1.
		args = append(args, req.Slots())
	}
	needsAck := granted
	if req.Replace {
		// A refusal of a request with Replace wrote the marks of the queue
		// rules: in Sentinel mode it waits for the replicas as a grant does,
		// so that a failover rarely loses them (best effort: the refusal is
		// reported whatever WAIT says; the request's next call writes the
		// marks again).
		needsAck = func(any) bool { return true }
	}
	v, acked, err := l.runAcked(ctx, script, n.client, name, req.TTL, needsAck, keys, args...)
	if err != nil {
		return acquireReply{}, err
	}
	// Taken: the fencing token, a bare string (the cheapest reply to build).
	if f, ok := v.(string); ok {
		fence, err := strconv.ParseInt(f, 10, 64)
		if err == nil && (fence <= 0 || fence > maxToken) {
			err = fmt.Errorf("fencing token %d out of range [1, %d]", fence, maxToken)
		}
		if err != nil {
			return acquireReply{}, fmt.Errorf("%s script: unexpected reply %q: %w", name, f, err)
		}
		// Sentinel mode: a grant the replicas did not acknowledge would not
		// survive a failover. It is an error, with the token the node
		// issued, so that the attempt releases that grant (by its token)
		// and reports it not held.
		if err := acked.check(fmt.Sprintf("acquire keys %q", req.Keys)); err != nil {
			return acquireReply{fence: fence}, err
		}
		return acquireReply{ok: true, fence: fence}, nil
	}
	if s, ok := v.([]any); ok && len(s) == 2 {
		return replacedReply(name, req, s)
	}
	// Busy: a table that starts with 0.
	s, err := asSlice(v, 9)
	if err != nil {
		return acquireReply{}, fmt.Errorf("%s script: %w", name, err)
	}
	d := decoder{s: s}
	i := d.taggedKey(0, "busy", len(req.Keys))
	if d.err != nil {
		return acquireReply{}, fmt.Errorf("%s script: %w", name, d.err)
	}
	r := acquireReply{
		held: &lock.HeldError{
			Key:      req.Keys[i],
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

// replacedReply decodes an acquisition script's {2, key index}: a newer
// request with Replace dropped the owner from that key's queue.
func replacedReply(name string, req lock.Request, s []any) (acquireReply, error) {
	d := decoder{s: s}
	i := d.taggedKey(2, "replaced", len(req.Keys))
	if d.err != nil {
		return acquireReply{}, fmt.Errorf("%s script: %w", name, d.err)
	}
	return acquireReply{replaced: req.Keys[i]}, nil
}

// taggedKey reads the head of an acquisition script's refusal, {tag, key
// index (1-based), ...}: the tag must be want, and the index one of n keys
// (what names it in the error). It returns the key's 0-based index.
func (d *decoder) taggedKey(want int64, what string, n int) int {
	if d.int(0) != want && d.err == nil {
		d.err = fmt.Errorf("unexpected reply %v: want %d first", d.s, want)
	}
	idx := d.int(1)
	if d.err == nil && (idx < 1 || int(idx) > n) {
		d.err = fmt.Errorf("%s key index %d out of range [1, %d]", what, idx, n)
	}
	return int(idx) - 1
}

// granted tells an acquisition script's grant (the fencing token, a string)
// from its refusal (a table).
func granted(v any) bool {
	_, ok := v.(string)
	return ok
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
	return min(max(start.UnixMicro()+fenceLead.Microseconds(), 1), maxToken)
}

// TryAcquire (lock.Acquisitions, over attempt) makes one attempt to take every
// key of req (see lock.Locker).
//
// A key is free for req when nobody holds it and its FIFO queue is empty or
// has req's owner at its head: a request without Queue does not jump a
// non-empty queue either (it fails with a *lock.HeldError whose Waiters
// counts the queue). With req.Queue a request that cannot take the keys joins
// (or refreshes its place in) the queue of every key, and must call again
// within the waiter TTL to keep it; so req.Owner is required with Queue.
//
// With req.Limit N > 1 the request takes req.Weight (at least 1) of N slots
// of each key (a counting semaphore): the slots are free for it when no mutex
// holds the key and the weights of the holders, of the waiters queued ahead
// of it (every waiter, when it is not queued) and its own sum to at most the
// smallest limit among its own and the holders' (strict FIFO by weight). A
// mutex request needs the key free of semaphore holders too. The
// *lock.HeldError of a busy key counts its holders (not their weights) and
// names the oldest.
//
// In Redlock mode the keys must be taken on a quorum of the nodes within the
// lease's validity (TTL minus elapsed time minus drift): a majority for a
// mutex, floor(M*N/(N+1)) + 1 of M nodes for a semaphore of N slots
// (quorumFor); otherwise what the nodes granted is released there (by the
// token each issued; a node whose reply was lost is left to the TTL, see
// attempt) and the error matches lock.ErrQuorum (a *QuorumError saying how many nodes agreed
// and were needed), or is a *lock.HeldError when too many nodes said the keys
// are busy for a quorum to be possible.
//
// In Sentinel mode a grant counts only once Config.MinReplicas replicas
// acknowledged it (WAIT, within WithReplicaTimeout): otherwise it is released
// and the error is a *ReplicaError (matching lock.ErrBackendUnavailable)
// saying how many acknowledged; see replicas.go.
//
// attempt is one acquisition on every node. It returns the lease, or a hint
// of when the busy holder's lease ends (0 when unknown) and the error.
//
// In Redlock mode it returns as soon as the outcome is decided: a quorum
// granted, or so many nodes refused or failed that no quorum is possible.
// The nodes that had not answered by then are settled in the background
// as their answers come (settleLate), and so are the nodes that failed
// (settleFailed).
func (l *Locker) attempt(ctx context.Context, req lock.Request) (*lock.Lease, time.Duration, error) {
	redlock := len(l.nodes) > 1
	start := l.opts.Clock.Now()
	var ticket, proposal int64
	if redlock {
		proposal = fenceProposal(start)
		if req.Queue {
			ticket = l.queueTicket(req.Owner, start)
		}
	}
	timeout := l.callTimeout(req.TTL)
	quorum := l.quorumFor(req.Limit)
	var g gathered
	if redlock {
		g = l.gather(ctx, req, ticket, proposal, timeout, quorum)
	} else {
		// In Sentinel mode the call includes the wait for the replicas.
		g.answered = fanOut(ctx, l.nodes, timeout+l.replicaWait(req.TTL), func(ctx context.Context, n *node) (acquireReply, error) {
			return l.acquireOn(ctx, n, req, ticket, proposal)
		})
	}
	// The late answers wait for the outcome (settleLate); deliver gives it
	// to them, before any cleanup that waits for earlier calls (chains).
	delivered := false
	deliver := func(granted bool, fence int64) {
		if redlock && !delivered {
			delivered = true
			g.final <- verdict{granted: granted, fence: fence}
		}
	}
	defer deliver(false, 0)
	var (
		acquired  []result[acquireReply]
		busyNodes []*node
		failed    []*node
		unacked   []result[acquireReply] // failed, but granted with a known token (fence set)
		fence     int64
		busy      []*lock.HeldError
		replaced  []string // the key each node that replaced the owner named
		errs      []error
		hint      time.Duration
		maxTicket int64
	)
	for _, r := range g.answered {
		switch {
		case r.err != nil:
			failed = append(failed, r.node)
			if r.val.fence > 0 {
				unacked = append(unacked, r)
			}
			errs = append(errs, r.nodeErr())
			l.log.V(2).Info("Acquire failed on node", "node", r.node.name, "keys", req.Keys, "err", r.err.Error())
		case r.val.ok:
			acquired = append(acquired, r)
			fence = max(fence, r.val.fence)
		case r.val.replaced != "":
			// Not lock.ErrReplaced itself: a mark on fewer nodes than
			// would stop a quorum does not end the owner's wait.
			replaced = append(replaced, r.val.replaced)
			errs = append(errs, &lock.NodeError{Node: r.node.name, Err: fmt.Errorf("a newer request took the owner's place in the queue of key %q", r.val.replaced)})
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
	if g.ctxErr != nil {
		errs = append(errs, fmt.Errorf("%d node(s) had not answered: %w", g.pending, g.ctxErr))
	}
	if redlock && req.Queue && maxTicket > 0 {
		l.rememberTicket(req.Owner, maxTicket, start)
	}
	agreed := len(acquired)
	wroteBack := false
	if redlock && agreed >= quorum {
		wroteBack = true
		var err error
		agreed, fence, err = l.writeBack(ctx, req, acquired, fence, timeout)
		if err != nil {
			errs = append(errs, err)
		}
	}
	elapsed := l.opts.Clock.Since(start)
	validity := req.TTL - elapsed - drift(req.TTL)
	if agreed >= quorum && validity > 0 {
		if redlock {
			l.tickets.Delete(req.Owner)
		}
		leave := busyNodes
		if keepsPlace(req, ticket) {
			// semacquire.lua kept the owner's place where it granted.
			for _, r := range acquired {
				leave = append(leave, r.node)
			}
		}
		if req.Queue && len(leave) > 0 {
			// The nodes that refused queued the owner: there it would hold a
			// place ahead of the next waiters (refusing every one of them
			// until its waiter TTL ran out), and the quorum of the next
			// acquisitions may need those nodes.
			l.leaveQueues(ctx, leave, req.Keys, req.Owner)
		}
		deliver(true, fence)
		if redlock && req.Queue {
			l.settleFailed(req, failed, l.dequeueOnNode)
		}
		lease := lock.NewLease(req, fence, start, start.Add(validity))
		if v := l.log.V(1); v.Enabled() {
			v.Info("Acquired lease", "keys", req.Keys, "holder", req.Holder, "fence", fence, "validity", validity.String())
		}
		return lease, 0, nil
	}

	// Not acquired: undo what this attempt took on the nodes that granted
	// it. Each named its token (raised to fence where the write-back ran):
	// only that acquisition is released there, not a later one of the same
	// owner (a restarted operator), whose token is larger. A node that
	// refused took nothing. A node that failed may have run the script
	// before the reply was lost, but its token is unknown, and releasing the
	// owner's keys whatever their token could free a later acquisition of
	// the owner by another process (an old operator resumed after a pause):
	// such a grant is left to its TTL, or taken over by the owner's next
	// attempt (acquiring keys the owner holds renews them, with a new token).
	// A grant the replicas did not acknowledge (unacked) failed with its
	// token: released like a grant.
	if len(acquired)+len(unacked) > 0 {
		var granted []*node
		issued := make(map[*node]int64, len(acquired)+len(unacked))
		for _, r := range acquired {
			granted = append(granted, r.node)
			issued[r.node] = r.val.fence
			if wroteBack {
				issued[r.node] = max(r.val.fence, fence)
			}
		}
		for _, r := range unacked {
			granted = append(granted, r.node)
			issued[r.node] = r.val.fence
		}
		l.releaseOnNodes(ctx, granted, req.Keys, req.Owner, req.Limit, func(n *node) int64 { return issued[n] })
	}
	deliver(false, 0)
	op := fmt.Sprintf("acquire keys %q", req.Keys)
	if req.Holders() > 1 && redlock {
		op = fmt.Sprintf("acquire a slot of %d on keys %q (a semaphore needs %d of %d nodes, more than a majority)", req.Holders(), req.Keys, quorum, len(l.nodes))
	}
	if agreed >= quorum {
		slow := fmt.Errorf("the acquisition took %v, leaving no validity of the %v TTL (drift allowance %v)", elapsed, req.TTL, drift(req.TTL))
		return nil, hint, l.failureOf(op, agreed, quorum, append(errs, slow))
	}
	if len(replaced) > len(l.nodes)-quorum {
		// Dropped from the queues by a newer request with Replace on so
		// many nodes that no quorum would take it: it is told so, and
		// leaves the queues of the nodes that missed the drop.
		if redlock {
			l.tickets.Delete(req.Owner)
			if req.Queue && len(busyNodes) > 0 {
				l.leaveQueues(ctx, busyNodes, req.Keys, req.Owner)
			}
		}
		return nil, 0, fmt.Errorf("%s: %w: a newer request took its place in the queue of key %q", op, lock.ErrReplaced, replaced[0])
	}
	if len(busy) > len(l.nodes)-quorum {
		return nil, hint, pickHeld(busy)
	}
	return nil, hint, l.failureOf(op, agreed, quorum, errs)
}

// queuedTicket is the queue ticket a Redlock waiter was given, and until
// when its place is certainly kept without a heartbeat.
type queuedTicket struct {
	ticket int64
	until  time.Time
}

// queueTicket returns the ticket to queue owner with: the one the nodes gave
// it (their largest), so that a node that missed its join or restarted
// empty puts it at the same place as the others; 0 once its place may have
// expired (the waiter TTL passed since it last joined): a waiter that missed
// its heartbeats is pruned and must draw a new ticket at the back.
func (l *Locker) queueTicket(owner string, now time.Time) int64 {
	v, ok := l.tickets.Load(owner)
	if !ok {
		return 0
	}
	q := v.(queuedTicket)
	if !now.Before(q.until) {
		l.tickets.CompareAndDelete(owner, v)
		return 0
	}
	return q.ticket
}

// rememberTicket records the ticket the nodes gave owner in an attempt that
// started at start: every node that queued it set its heartbeat deadline at
// least a waiter TTL after start (less the drift allowance between clocks).
func (l *Locker) rememberTicket(owner string, ticket int64, start time.Time) {
	l.tickets.Store(owner, queuedTicket{ticket: ticket, until: start.Add(l.opts.WaiterTTL - drift(l.opts.WaiterTTL))})
}

// gathered is what a Redlock fan-out had when the outcome was decided.
type gathered struct {
	// answered are the answers received, in arrival order.
	answered []result[acquireReply]
	// pending is how many nodes had not answered; their calls settle their
	// own answers (settleLate) once final delivers the outcome.
	pending int
	final   chan verdict
	// ctxErr is the caller's context error when it ended before the outcome
	// was decided.
	ctxErr error
}

// verdict is an attempt's outcome, for its late answers.
type verdict struct {
	granted bool
	fence   int64
}

// gather calls acquireOn on every node in parallel and returns once the
// outcome is decided (and the stragglers had a short grace, see below), or
// ctx ended: a quorum granted (with one token), so many nodes refused that
// the keys are busy whatever the others answer, or neither a quorum of
// grants nor of refusals is possible any more. A request with Queue changes
// the queues of the nodes that refuse it, and waits for every answer (each
// under the node timeout) so that its queues are settled when it returns: it
// only saves the release on the nodes that refused it.
//
// The calls are not cut short by the caller's context: a call still under
// way when gather returns settles its own answer once the attempt's outcome
// is known (settleLate), within its timeout and the cleanup timeout, and
// Close cancels it. At most maxBackground such calls run at once; past
// that, gather waits for every answer. On each node a call first waits for
// the same owner's late calls there (chains).
func (l *Locker) gather(ctx context.Context, req lock.Request, ticket, proposal int64, timeout time.Duration, quorum int) gathered {
	total := len(l.nodes)
	ch := make(chan result[acquireReply], total)
	final := make(chan verdict, 1)
	var (
		mu       sync.Mutex
		detached bool // the outcome is decided: late answers settle themselves
		outcome  *verdict
		once     sync.Once
	)
	// wait for the outcome, once for all the late calls.
	outcomeOf := func() verdict {
		once.Do(func() {
			v := <-final
			outcome = &v
		})
		return *outcome
	}
	// lates[i] registers node i's call as late once the outcome is decided
	// without it (under mu; nil while it may still answer in time).
	lates := make([]*lateCall, total)
	sent := make([]bool, total)
	for i, n := range l.nodes {
		prevs := l.chains.before(i, req.Owner)
		cctx, cancel := l.bg.callContext(ctx, timeout)
		call := func() {
			defer cancel()
			var r result[acquireReply]
			if err := waitFor(cctx, prevs); err != nil {
				r = result[acquireReply]{node: n, err: errNotSent(err)}
			} else {
				v, err := l.acquireOn(cctx, n, req, ticket, proposal)
				r = result[acquireReply]{node: n, val: v, err: err}
			}
			mu.Lock()
			if !detached {
				sent[i] = true
				ch <- r
				mu.Unlock()
				return
			}
			lc := lates[i]
			mu.Unlock()
			defer l.bg.free(1)
			defer lc.end()
			l.settleLate(r, req, outcomeOf())
		}
		if !l.bg.spawn(call) {
			cancel()
			mu.Lock()
			sent[i] = true
			ch <- result[acquireReply]{node: n, err: errClosed}
			mu.Unlock()
		}
	}
	g := gathered{final: final}
	var granted, busy int
	var lo, hi int64 // the smallest and largest token granted
	add := func(r result[acquireReply]) {
		g.answered = append(g.answered, r)
		switch {
		case r.err != nil:
		case r.val.ok:
			if granted == 0 || r.val.fence < lo {
				lo = r.val.fence
			}
			hi = max(hi, r.val.fence)
			granted++
		default:
			busy++
		}
	}
	decided := func() bool {
		pending := total - len(g.answered)
		switch {
		case pending == 0:
			return true
		case granted >= quorum:
			// Granted, unless the write-back or the dequeue below must
			// reach the nodes still to answer: when the granting nodes
			// disagree on the token, the lease takes the largest any node
			// issues and is written back to all of them; a queued request
			// leaves the queues of the nodes that refuse it before the
			// caller is told it holds the lease.
			return lo == hi && !req.Queue
		case busy > total-quorum:
			// A *lock.HeldError, whatever the others answer. A queued
			// request waits for them all the same: the nodes that refuse it
			// queue it, and its next call (or anyone's Inspect) must find
			// the queues as they answered.
			return !req.Queue
		default:
			// A *QuorumError, whatever the others answer: they can make
			// neither a quorum of grants nor of refusals.
			return !req.Queue && granted+pending < quorum && busy+pending <= total-quorum
		}
	}
	// Once the outcome is decided, the nodes that answer within
	// stragglerGrace times the time the outcome took (at least 2ms) are
	// still waited for: their answers are in the normal spread of a loaded
	// server and are settled before returning (a partial grant released
	// before the caller tries again, rather than competing with its next
	// try; a grant with another token written back before anyone inspects
	// the key). Only much slower nodes, paused or cut off, are left to
	// settle in the background.
	began := time.Now()
	var grace <-chan time.Time
	graceOver := false
	for ctx.Err() == nil {
		if decided() {
			if len(g.answered) == total || graceOver {
				break
			}
			if grace == nil {
				t := time.NewTimer(min(max(stragglerGrace*time.Since(began), 2*time.Millisecond), timeout))
				defer t.Stop()
				grace = t.C
			}
		}
		select {
		case r := <-ch:
			add(r)
		case <-grace:
			graceOver = true
		case <-ctx.Done():
		}
	}
	if !decided() {
		g.ctxErr = ctx.Err()
	}
	mu.Lock()
	// The answers already sent are taken here; the calls still under way
	// settle their own answers, within the bound of background calls.
	for len(g.answered) < total {
		select {
		case r := <-ch:
			add(r)
			continue
		default:
		}
		break
	}
	if pending := total - len(g.answered); pending > 0 && !l.bg.reserve(pending) {
		mu.Unlock()
		for len(g.answered) < total {
			add(<-ch)
		}
		mu.Lock()
	}
	g.pending = total - len(g.answered)
	for i, done := range sent {
		if !done {
			lates[i] = l.chains.add(i, req.Owner)
		}
	}
	detached = true
	mu.Unlock()
	return g
}

// stragglerGrace is how many times the time an attempt's outcome took it
// still waits for the nodes that have not answered (see gather).
const stragglerGrace = 4

// settleLate settles the answer of a node that came after the attempt's
// outcome was decided:
//
//   - not granted: a grant (also one the replicas did not acknowledge) is
//     released on that node, by its token; a refusal took nothing (with
//     Queue, the owner stays queued there: it is a waiter); another failure
//     is left alone (the script may have run before the reply was lost, but
//     with an unknown token: see attempt).
//   - granted: a grant is kept: the node holds the lease like the others.
//     When it issued another token than the lease's (its counter was
//     ahead), the lease's is written back there (raise.lua), as the
//     write-back would have done had it answered in time; a semaphore slot
//     whose node refuses that (semraise.lua) is released. With Queue, a
//     refusal or a failure dequeues the owner there (it may have been
//     queued before the reply was lost), and so does a semaphore's grant
//     (it may have kept the owner's place: keepsPlace): a granted owner
//     keeps no place in any queue.
//
// It runs on the late call's goroutine; the owner's next calls to that node
// wait for it (chains).
func (l *Locker) settleLate(r result[acquireReply], req lock.Request, v verdict) {
	switch {
	case !v.granted && r.val.ok, !v.granted && r.err != nil && r.val.fence > 0:
		// A grant, or one the replicas did not acknowledge (acquireOn).
		l.releaseOnNode(r.node, req, r.val.fence)
	case v.granted && r.err == nil && r.val.ok:
		if req.Queue && req.Holders() > 1 {
			// A semaphore waiter's grant may have kept its place there
			// (keepsPlace).
			defer l.dequeueOnNode(r.node, req)
		}
		if r.val.fence != v.fence {
			ctx, cancel := l.bg.cleanupContext(l.opts.nodeTimeout)
			defer cancel()
			held, err := l.raiseOn(ctx, r.node, req, v.fence, r.val.fence)
			switch {
			case err != nil:
				l.log.V(2).Info("Fence write-back failed on node", "node", r.node.name, "keys", req.Keys, "fence", v.fence, "err", err.Error())
			case held < 0:
				// semraise.lua: the node has issued the lease's token (or a
				// larger one) to another holder; it cannot record it as
				// this lease's, so it does not keep the lease.
				l.releaseOnNode(r.node, req, r.val.fence)
			}
		}
	case v.granted && req.Queue:
		l.dequeueOnNode(r.node, req)
	}
}

// settleFailed runs settle (a release or a dequeue) on the nodes that
// failed before the outcome was decided, in the background when a slot is
// free (the node may be the slow one; the cleanup is then a late call that
// the owner's later calls wait for), each after the owner's late calls to
// that node (chains).
func (l *Locker) settleFailed(req lock.Request, failed []*node, settle func(*node, lock.Request)) {
	for _, n := range failed {
		i := l.nodeIndex(n)
		prevs := l.chains.before(i, req.Owner)
		if !l.bg.reserve(1) {
			ctx, cancel := l.bg.cleanupContext(l.opts.nodeTimeout)
			if waitFor(ctx, prevs) == nil {
				settle(n, req)
			}
			cancel()
			continue
		}
		lc := l.chains.add(i, req.Owner)
		if !l.bg.spawn(func() {
			defer l.bg.free(1)
			defer lc.end()
			ctx, cancel := l.bg.cleanupContext(l.opts.nodeTimeout)
			defer cancel()
			if waitFor(ctx, prevs) == nil {
				settle(n, req)
			}
		}) {
			l.bg.free(1)
			lc.end()
		}
	}
}

// releaseOnNode releases the request's keys on one node, best effort: the
// owner's holdings with a token of at most upTo.
func (l *Locker) releaseOnNode(n *node, req lock.Request, upTo int64) {
	ctx, cancel := l.bg.cleanupContext(l.opts.nodeTimeout)
	defer cancel()
	for _, r := range l.releaseOn(ctx, []*node{n}, req.Keys, req.Owner, req.Limit, sameFence(upTo)) {
		if r.err != nil {
			l.log.V(2).Info("Best-effort release failed on node; the lease expires with its TTL", "node", r.node.name, "keys", req.Keys, "err", r.err.Error())
		}
	}
}

// dequeueOnNode removes the request's owner from its keys' queues on one
// node, best effort.
func (l *Locker) dequeueOnNode(n *node, req lock.Request) {
	ctx, cancel := l.bg.cleanupContext(l.opts.nodeTimeout)
	defer cancel()
	for _, r := range l.dequeueOn(ctx, []*node{n}, req.Keys, req.Owner) {
		if r.err != nil {
			l.log.V(2).Info("Leaving the queue failed on node; the place expires with the waiter TTL", "node", r.node.name, "keys", req.Keys, "err", r.err.Error())
		}
	}
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
// with counters at fence or above (a node counts only when raise.lua or
// semraise.lua says the owner still holds every key there) and the lease's
// token.
//
// A semaphore's holders overlap, so a node may meanwhile have issued the
// lease's token, or a larger one, to another holder: semraise.lua then
// refuses and answers with its counter, and the token moves above the
// largest such counter, written to every node of the lease again (at most
// writeBackRounds times; after that no node counts). Two holders therefore
// never share a token: the second write-back of a token to a node both hold
// finds the counter the first left there. A mutex has no such race: no other
// lease of its keys is valid meanwhile.
func (l *Locker) writeBack(ctx context.Context, req lock.Request, acquired []result[acquireReply], fence int64, timeout time.Duration) (int, int64, error) {
	done := 0
	var behind []*node
	for _, r := range acquired {
		if r.val.fence >= fence {
			done++
		} else {
			behind = append(behind, r.node)
		}
	}
	for round := 1; len(behind) > 0; round++ {
		if l.beforeWriteBack != nil {
			l.beforeWriteBack()
		}
		res := fanOut(ctx, behind, timeout, func(ctx context.Context, n *node) (int64, error) {
			return l.raiseOn(ctx, n, req, fence, 0)
		})
		var ahead int64
		for _, r := range res {
			switch {
			case r.err != nil:
				l.log.V(2).Info("Fence write-back failed on node", "node", r.node.name, "keys", req.Keys, "fence", fence, "err", r.err.Error())
			case r.val < 0:
				// semraise.lua: the node issued this token or a larger one
				// to another holder since.
				ahead = max(ahead, -r.val)
			case r.val != int64(len(req.Keys)):
				// The lease expired there, or was taken over, between the grant
				// and the write-back: the node does not hold it.
				l.log.V(2).Info("Fence write-back found the lease gone on node", "node", r.node.name, "keys", req.Keys, "held", r.val)
			default:
				done++
			}
		}
		if ahead == 0 {
			break
		}
		if round == writeBackRounds || ahead >= maxToken {
			return 0, fence, fmt.Errorf("fencing token %d: the nodes issued tokens up to %d to other holders meanwhile (%d write-back(s))", fence, ahead, round)
		}
		l.log.V(2).Info("Fence write-back found the token issued to another holder; moving above it", "keys", req.Keys, "fence", fence, "issued", ahead)
		fence, behind, done = ahead+1, behind[:0], 0
		for _, r := range acquired {
			behind = append(behind, r.node)
		}
	}
	return done, fence, nil
}

// writeBackRounds bounds how often writeBack moves a semaphore lease's token
// above tokens issued to other holders meanwhile.
const writeBackRounds = 3

// raiseOn runs raise.lua (semraise.lua for a semaphore) on one node: the
// counters are raised to fence where lower, and fence is recorded as the
// token of the owner's lease there: a lease of the owner with a token of at
// most fence, or with issued, the token this node issued to this very
// acquisition (a late grant whose node was ahead; 0: none known), never a
// later acquisition of the owner. It returns how many keys the owner holds
// so there; for a semaphore, minus the node's counter when that is at or
// past fence (semraise.lua refused: see writeBack).
func (l *Locker) raiseOn(ctx context.Context, n *node, req lock.Request, fence, issued int64) (int64, error) {
	keys := l.redisKeys(req.Keys, "lock", "fence", "preempted")
	script, name := raiseScript, "raise"
	if req.Holders() > 1 {
		keys = l.redisKeys(req.Keys, "fence", "slots", "slotfences", "slotmeta", "preempted")
		script, name = semRaiseScript, "semaphore raise"
	}
	v, err := run(ctx, script, n.client, name, keys, fence, scriptOwner(req.Owner, req.Holders()), issued)
	if err != nil {
		return 0, err
	}
	return asInt(v)
}

// releaseEverywhere releases the owner's keys (its slots when limit > 1)
// held with a token of at most upTo on every node, best effort, even when
// ctx has ended.
func (l *Locker) releaseEverywhere(ctx context.Context, keys []string, owner string, limit int, upTo int64) {
	l.releaseOnNodes(ctx, l.nodes, keys, owner, limit, sameFence(upTo))
}

// releaseOnNodes releases the owner's keys on some nodes (as releaseOn),
// best effort, even when ctx has ended.
func (l *Locker) releaseOnNodes(ctx context.Context, nodes []*node, keys []string, owner string, limit int, upTo func(*node) int64) {
	cctx, cancel := l.cleanupContext(ctx)
	defer cancel()
	for _, r := range l.releaseOn(cctx, nodes, keys, owner, limit, upTo) {
		if r.err != nil {
			l.log.V(2).Info("Best-effort release failed on node", "node", r.node.name, "keys", keys, "err", r.err.Error())
		}
	}
}

// maxToken is the largest valid fencing token: tokens are below
// lock.MaxFence (see lock.Lease). acquire.lua and semacquire.lua get it as
// their "largest fencing token allowed", fenceProposal never proposes more,
// and acquireOn refuses a token above it.
const maxToken = lock.MaxFence - 1

// maxTokenArg is maxToken as a script argument, converted once.
var maxTokenArg any = strconv.FormatInt(maxToken, 10)
