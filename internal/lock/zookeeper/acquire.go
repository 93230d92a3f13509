package zookeeper

import (
	"context"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// maxTries bounds the read-decide-write rounds of one operation when other
// clients keep changing the nodes between the read and the write.
const maxTries = 6

// wait is Acquire (lock.Acquisitions) once req is prepared: it blocks until it
// holds every key of req or ctx ends (see lock.Locker).
// After a failed attempt it sets a ZooKeeper watch on what blocks it (the
// holder node or a slot node of another owner, or the live waiter just
// ahead of it in the queue) and tries
// again when that node goes away, or after the next backoff step
// (WithBackoff), whichever comes first. With req.Queue it waits in the keys'
// queues (by arrival less req.Boost), refreshing its place at least every
// third of the waiter TTL, and leaves the queues when ctx ends. ZooKeeper
// errors are retried too; when ctx ends the error wraps both ctx.Err() and
// the last attempt's error.
func (l *Locker) wait(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	log := l.opts.Log.WithValues("keys", req.Keys, "holder", req.Holder)
	// The node last watched and the watch's channel, while it has not fired.
	var watched string
	var watchCh <-chan zk.Event
	return lock.BlockingAcquire(ctx, &l.opts.Options, req, lock.Steps[zk.Event]{
		Attempt: func(ctx context.Context) (*lock.Lease, lock.Wake[zk.Event], error) {
			lease, blocker, err := l.attempt(ctx, req)
			if err == nil || blocker == "" || ctx.Err() != nil {
				return lease, lock.Wake[zk.Event]{C: watchCh}, err
			}
			if blocker == watched {
				// The watch set on this node before has not fired: wait
				// on it rather than register another (the client keeps
				// every one until the node changes).
				return nil, lock.Wake[zk.Event]{C: watchCh}, err
			}
			watched, watchCh = "", nil
			type res struct {
				exists bool
				ch     <-chan zk.Event
			}
			r, werr := call(ctx, l, func(c *zk.Conn) (res, error) {
				ok, _, ch, err := c.ExistsW(blocker)
				return res{ok, ch}, err
			})
			switch {
			case werr != nil:
				log.V(2).Info("Watching the blocking node failed; polling only", "node", blocker, "err", werr.Error())
				return nil, lock.Wake[zk.Event]{}, err
			case !r.exists:
				// Gone already: try again at once.
				return nil, lock.Wake[zk.Event]{Now: true}, err
			}
			watched, watchCh = blocker, r.ch
			return nil, lock.Wake[zk.Event]{C: watchCh}, err
		},
		Woken:     func(zk.Event, bool) { watched, watchCh = "", nil },
		Dequeue:   func(ctx context.Context) error { return l.Dequeue(ctx, req.Keys, req.Owner) },
		Closed:    l.ctx.Done(),
		ClosedErr: errLockerClosed,
	})
}

// keyPlan is what one attempt decided about one key.
type keyPlan struct {
	view  *keyView
	mine  *waiterView   // req's waiter node, if queued
	dead  []*waiterView // other waiters past the waiter TTL (ensemble clock)
	live  []*waiterView // the other waiters
	ahead []*waiterView // live waiters ahead of req
	// replaced are the older waiters a request with Replace drops, each
	// leaving a replacement mark; deadMarks the marks past their time on
	// the ensemble's clock (see markTTL), deleted at the version read.
	replaced  []*waiterView
	deadMarks []*markView
}

// room is how many more slots the key has free for a request of the owner
// hash with limit (Request.Holders): none while a live holder node of
// another owner holds it (a mutex), none for a mutex while a live slot of
// another owner does, else the smallest limit of the request's and the
// live slots' of other owners, minus the weights of those slots (each its
// Request.Slots; one for a slot the previous release wrote). The owner's
// own nodes do not count (an acquisition replaces them) nor do stale ones
// (it deletes them), except an own lease a request with Preempt stopped
// while others wait: its owner does not escape the preemption by taking
// the key again, it is refused like anyone else.
func (p *keyPlan) room(hash string, limit int, ignoreSlots bool) int {
	bound, used := limit, 0
	for _, h := range p.view.leases() {
		if h.data.Owner == hash && h.data.Preempted && len(p.live) > 0 {
			return 0
		}
		if h.data.Owner == hash || h.stale {
			continue
		}
		if h.name == holderName {
			return 0
		}
		if ignoreSlots && limit > 1 {
			continue // the mutant (tests only): see Locker.ignoreSlots
		}
		used += h.weight()
		bound = min(bound, h.limit())
	}
	return max(bound-used, 0)
}

// aheadWeight is the slots the live waiters ahead of the request ask for
// (each its Request.Slots; one for a waiter the previous release queued).
func (p *keyPlan) aheadWeight() int {
	n := 0
	for _, w := range p.ahead {
		n += w.weight()
	}
	return n
}

// liveLeases are the leases holding the key that do not count as free: all
// but the stale ones, the owner's own included; oldest first.
func (p *keyPlan) liveLeases() []*holderView {
	var out []*holderView
	for _, h := range p.view.leases() {
		if !h.stale {
			out = append(out, h)
		}
	}
	return out
}

// TryAcquire (lock.Acquisitions, over attempt) makes one attempt to take every
// key of req (see lock.Locker).
//
// A key is free for req when the leases of other owners leave room for it
// (a mutex: none is live; a semaphore, req.Limit > 1: no live mutex, and
// the weights of the live slots plus req's own weight, req.Slots(), within
// the smallest Limit of req's and theirs) and the weights of the live
// waiters ahead of req's owner in its queue fit in that room beside req's
// (strict FIFO by weight: a heavy waiter is never passed by lighter ones
// behind it): a request without Queue counts every live waiter as ahead, so
// it does not jump a queue that takes the free slots (it fails with a
// *lock.HeldError whose Waiters counts the queue). With req.Queue a
// request that cannot take the keys joins (or refreshes its place in) the
// queue of every key, its weight stored in its waiter nodes, and must call
// again within the waiter TTL to keep it; so req.Owner is required with
// Queue. An owner that already holds every key gets them again with a new
// fencing token (its own lease's weight does not count: the new one
// replaces it). The HeldError's Holders counts the live leases holding the
// busy key (0 when it is free but others are queued ahead), Holder and
// Fence name the oldest when they leave no room for req's weight; Waiters
// is the exact number of live waiters, the caller included. req.Replace and
// req.Preempt are applied in the same attempt (see the package
// documentation, Replace and Preempt); an owner a newer request replaced
// fails with an error matching lock.ErrReplaced.
//
// attempt is one acquisition. It returns the lease, or the path of the node
// whose deletion may let the request in (for Acquire to watch) and the error.
func (l *Locker) attempt(ctx context.Context, req lock.Request) (*lock.Lease, string, error) {
	op := fmt.Sprintf("acquire keys %q", req.Keys)
	hash := ownerHash(req.Owner)
	if err := l.ensureKeyNodes(ctx, req.Keys); err != nil {
		return nil, "", l.unavailable(op, err)
	}
	synced := false
	var lastHeld *lock.HeldError
	for range maxTries {
		start := l.opts.Now()
		views, err := l.readKeys(ctx, req.Keys)
		if err != nil {
			return nil, "", l.unavailable(op, err)
		}
		if missing := l.forgetMissing(views); missing {
			if err := l.ensureKeyNodes(ctx, req.Keys); err != nil {
				return nil, "", l.unavailable(op, err)
			}
			continue
		}
		plans := make([]*keyPlan, len(views))
		othersQueued, heldByOther := false, false
		for i, v := range views {
			p := &keyPlan{view: v}
			for _, w := range v.waiters {
				if w.hash == hash {
					if p.mine == nil {
						p.mine = w
					}
					continue
				}
				p.live = append(p.live, w)
			}
			for _, w := range p.live {
				if w.aheadOf(p.mine) {
					othersQueued = true
				}
			}
			if p.room(hash, req.Holders(), l.ignoreSlots) < req.Slots() {
				heldByOther = true // as far as this read can tell
			}
			plans[i] = p
		}
		if err := l.checkReplaced(ctx, req, hash, plans); err != nil {
			return nil, "", err
		}
		// The key looks busy: make sure that is not a lagging server's view
		// before acting on it (a free key is validated by the write instead).
		if (heldByOther || othersQueued) && !synced {
			if err := l.sync(ctx); err != nil {
				return nil, "", l.unavailable(op, err)
			}
			synced = true
			continue
		}

		// The ensemble's clock, to tell dead waiters from live ones: the
		// mtime of a node written now. A queued request gets it from its own
		// heartbeat, which it owes anyway.
		var nowMs int64
		switch {
		case req.Queue && (heldByOther || othersQueued):
			nowMs, err = l.heartbeat(ctx, req, hash, plans)
			if isConflict(err) {
				if err := l.sync(ctx); err != nil {
					return nil, "", l.unavailable(op, err)
				}
				synced = true
				continue
			}
			if err != nil {
				return nil, "", l.unavailable(op, err)
			}
		case othersQueued || heldByOther && mightBeStale(plans, hash, l.opts.Now()):
			if _, nowMs, err = l.serverNow(ctx); err != nil {
				return nil, "", l.unavailable(op, err)
			}
		}
		if nowMs > 0 {
			for _, p := range plans {
				for _, h := range p.view.leases() {
					if h.data.Owner != hash && staleHolder(h, nowMs, l.cfg.maxClockSkew()) {
						h.stale = true
					}
				}
			}
			cutoff := nowMs - l.opts.WaiterTTL.Milliseconds() - l.cfg.maxClockSkew().Milliseconds()
			for _, p := range plans {
				live := p.live[:0:0]
				for _, w := range p.live {
					if w.stat.Mtime < cutoff {
						p.dead = append(p.dead, w)
					} else {
						live = append(live, w)
					}
				}
				p.live = live
			}
			for _, p := range plans {
				for h, m := range p.view.marks {
					if h != hash && !l.markLive(m, nowMs) {
						p.deadMarks = append(p.deadMarks, m)
					}
				}
			}
		}
		if req.Replace {
			dropOlder(plans)
		}
		for _, p := range plans {
			for _, w := range p.live {
				if w.aheadOf(p.mine) {
					p.ahead = append(p.ahead, w)
				}
			}
		}

		held, blocker := l.busy(req, hash, plans)
		if held != nil {
			// Refused: drop the older waiters (Replace) and stop the
			// holders (Preempt) in one transaction, at the versions read.
			if ops := l.policyOps(req, hash, plans); len(ops) > 0 {
				if l.beforePolicies != nil {
					l.beforePolicies()
				}
				if _, err := l.multi(ctx, ops); err != nil {
					if !isConflict(err) {
						return nil, "", l.unavailable(op, fmt.Errorf("replace or preempt: %w", err))
					}
					if err := l.sync(ctx); err != nil {
						return nil, "", l.unavailable(op, err)
					}
					synced = true
					lastHeld = held
					continue
				}
			}
			l.prune(ctx, plans)
			return nil, blocker, held
		}

		lease, err := l.take(ctx, req, hash, plans, start)
		if err == nil {
			return lease, "", nil
		}
		if !isConflict(err) {
			return nil, "", err
		}
		// Someone changed the keys between the read and the write: read again.
		if err := l.sync(ctx); err != nil {
			return nil, "", l.unavailable(op, err)
		}
		synced = true
		lastHeld = &lock.HeldError{Key: req.Keys[0], Position: -1}
	}
	if lastHeld == nil {
		return nil, "", l.unavailable(op, fmt.Errorf("the key nodes kept changing during %d attempts", maxTries))
	}
	// Other acquisitions kept winning the race to the write: report the keys busy.
	return nil, "", lastHeld
}

// forgetMissing drops key nodes that are gone (deleted by an administrator)
// from the known set, so they are created again; it reports whether any was.
func (l *Locker) forgetMissing(views []*keyView) bool {
	missing := false
	for _, v := range views {
		if !v.exists {
			l.parents.Delete(l.keyPath(v.key))
			missing = true
		}
	}
	return missing
}

// busy returns the HeldError for the first key req cannot take now and the
// node to watch, or nil when every key is free for req: a key is free for
// req while the weights of the live waiters ahead of it and its own
// (req.Slots) fit in the room left by the leases holding it (see
// keyPlan.room), so the first free slots go to the best-ranked waiters
// (arrival less Request.Boost), and a heavy waiter at the head keeps the
// slots that free up until it fits (weight 1 everywhere: fewer waiters
// ahead than free slots).
func (l *Locker) busy(req lock.Request, hash string, plans []*keyPlan) (*lock.HeldError, string) {
	for i, p := range plans {
		room := p.room(hash, req.Holders(), l.ignoreSlots)
		if p.aheadWeight()+req.Slots() <= room {
			continue
		}
		live := p.liveLeases()
		he := &lock.HeldError{Key: req.Keys[i], Position: -1, Waiters: len(p.live), Holders: len(live)}
		if p.mine != nil {
			he.Position = len(p.ahead)
			he.Waiters++
		}
		var blocker string
		if room < req.Slots() && len(live) > 0 {
			// The leases leave no room for req's weight: name the oldest;
			// at the head, watch a lease of another owner whose end makes
			// room (the holder node of a mutex, else the oldest slot).
			he.Holder, he.Fence = live[0].data.Holder, live[0].fence()
			for _, h := range live {
				if h.data.Owner != hash && len(p.ahead) == 0 {
					blocker = l.nodePath(p.view.key, h.name)
					break
				}
			}
		}
		if blocker == "" && len(p.ahead) > 0 {
			// Watch only the waiter just ahead: its deletion (it took the
			// key and released it, left, or died) is this request's turn.
			blocker = l.keyPath(p.view.key) + "/" + p.ahead[len(p.ahead)-1].name
			if p.mine == nil {
				blocker = l.keyPath(p.view.key) + "/" + p.ahead[0].name
			}
		}
		return he, blocker
	}
	return nil, ""
}

// staleHolder tells whether a holder node outlived its lease: its last write
// (mtime: the acquisition, renewal or move) plus the TTL written with it,
// plus the drift allowance and skew (how far apart the servers' clocks may
// be), is before nowMs, the mtime of a node written just now. Both times are
// the ensemble's (its leaders' clocks, see the package documentation), never
// this process's; they may come from different leaders, hence skew. The lease's holder was told
// its lease ends within min(TTL, session timeout) minus drift of the start of
// the round trip that wrote the node, so it no longer relies on it: the
// Locker that should have ended it at its TTL is gone, or its timer could
// not reach the ensemble (a quorum loss). Unreadable nodes ("?") are never
// stale.
func staleHolder(h *holderView, nowMs int64, skew time.Duration) bool {
	end, ok := h.endMs()
	if !ok {
		return false
	}
	ttl := time.Duration(h.ttlMs()) * time.Millisecond
	return end+drift(ttl).Milliseconds()+skew.Milliseconds() < nowMs
}

// staleSlack is how far ahead of this process's clock a holder's end may be
// for an acquirer to ask the ensemble's clock (one write) whether it passed:
// the local clock only spares the write for holders that are clearly live,
// a clock behind the ensemble's by more delays the takeover by the difference.
const staleSlack = 5 * time.Second

// mightBeStale tells whether some other owner's holder or slot node in plans
// may be past its TTL (staleHolder), judged by this process's clock with
// staleSlack.
func mightBeStale(plans []*keyPlan, hash string, now time.Time) bool {
	for _, p := range plans {
		for _, h := range p.view.leases() {
			if h.data.Owner == hash {
				continue
			}
			if end, ok := h.endMs(); ok && end < now.Add(staleSlack).UnixMilli() {
				return true
			}
		}
	}
	return false
}

// heartbeat joins req to the queue of every key, or refreshes its waiter
// nodes, in one transaction, and returns the ensemble's time of the write.
// A waiter joins every queue with one ticket and one rank: those of its
// oldest waiter node when it has one (it keeps its place), else a new
// arrival (arrive) less req.Boost.
func (l *Locker) heartbeat(ctx context.Context, req lock.Request, hash string, plans []*keyPlan) (int64, error) {
	var ticket, rank, nowMs int64
	missing := false
	for _, p := range plans {
		if p.mine == nil {
			missing = true
		} else if ticket == 0 || p.mine.ticket < ticket {
			ticket, rank = p.mine.ticket, p.mine.rank
		}
	}
	if missing && ticket == 0 {
		var arrival int64
		var err error
		if ticket, arrival, nowMs, err = l.arrive(ctx); err != nil {
			return 0, err
		}
		rank = arrival - req.Boost.Microseconds()
	}
	data := mustJSON(waiterData{Owner: hash, Holder: req.Holder, Weight: req.Slots()})
	session := l.conn.SessionID()
	ops := make([]any, 0, len(plans))
	setOps := make([]int, len(plans)) // index of each refresh (setData), -1 for none
	for i, p := range plans {
		setOps[i] = -1
		kp := l.keyPath(p.view.key)
		switch {
		case p.mine == nil:
			name := waiterName(rank, ticket, hash)
			ops = append(ops, &zk.CreateRequest{Path: kp + "/" + name, Data: data, Acl: l.acl, Flags: zk.FlagEphemeral})
		case p.mine.stat != nil && (p.mine.stat.EphemeralOwner != session || session == 0):
			// Another session's node (an earlier Locker of this operator,
			// before a restart or failover): move it into this session under
			// the same name, so the same ticket and place, as recovery moves
			// holder nodes. Else it would vanish when that session times out
			// and the waiter would queue again at the back.
			ops = append(ops,
				&zk.DeleteRequest{Path: kp + "/" + p.mine.name, Version: p.mine.stat.Version},
				&zk.CreateRequest{Path: kp + "/" + p.mine.name, Data: data, Acl: l.acl, Flags: zk.FlagEphemeral})
		default:
			setOps[i] = len(ops)
			ops = append(ops, &zk.SetDataRequest{Path: kp + "/" + p.mine.name, Data: data, Version: -1})
		}
	}
	res, err := l.multi(ctx, ops)
	if err != nil {
		return 0, fmt.Errorf("join the queues: %w", err)
	}
	for i, p := range plans {
		if p.mine == nil {
			name := waiterName(rank, ticket, hash)
			p.mine = &waiterView{name: name, rank: rank, ticket: ticket, hash: hash}
			continue
		}
		if k := setOps[i]; k >= 0 && k < len(res) && res[k].Stat != nil && res[k].Stat.Mtime > nowMs {
			nowMs = res[k].Stat.Mtime
		}
	}
	if nowMs == 0 {
		// Only creates and moves, whose answers carry no stat.
		if _, nowMs, err = l.serverNow(ctx); err != nil {
			return 0, err
		}
	}
	return nowMs, nil
}

// prune deletes dead waiters at the version read, so a waiter that refreshed
// its node since is kept. Best effort: the next acquirer prunes what is left.
func (l *Locker) prune(ctx context.Context, plans []*keyPlan) {
	var paths []string
	var versions []int32
	for _, p := range plans {
		for _, w := range p.dead {
			paths = append(paths, l.keyPath(p.view.key)+"/"+w.name)
			versions = append(versions, w.stat.Version)
		}
		for _, m := range p.deadMarks {
			paths = append(paths, l.keyPath(p.view.key)+"/"+m.name)
			versions = append(versions, m.stat.Version)
		}
	}
	parallel(len(paths), func(i int) error {
		_, err := call(ctx, l, func(c *zk.Conn) (struct{}, error) { return struct{}{}, c.Delete(paths[i], versions[i]) })
		if err != nil && !isConflict(err) {
			l.log.V(2).Info("Pruning a dead waiter failed", "node", paths[i], "err", err.Error())
		}
		return nil
	})
}

// take runs the acquisition transaction: for every key it deletes the dead
// waiters and replacement marks, drops the older waiters a request with
// Replace replaces (see replaceOps), deletes the stale holder and slot
// nodes of other owners (at the versions read, each with its renewal node's
// version read), the owner's own holder or slot node (an owner taking its
// keys again) and waiter node,
// creates the lease's node (the holder node for a mutex, the owner's slot
// node for a semaphore) and writes the key node at the version read. That
// write serializes the acquisitions of a key, so the room counted at read
// time (the slots held and their weights) is exact at commit. The key
// node's new mzxid is the fence.
func (l *Locker) take(ctx context.Context, req lock.Request, hash string, plans []*keyPlan, start time.Time) (*lock.Lease, error) {
	op := fmt.Sprintf("acquire keys %q", req.Keys)
	session, err := l.sessionFor(ctx, req.TTL)
	if err != nil {
		return nil, l.unavailable(op, err)
	}
	hd := holderData{Owner: hash, Holder: req.Holder, TTLMs: legacyTTLMs, Session: session}
	name := leaseNodeName(req.Holders(), hash)
	if name != holderName {
		hd.Limit, hd.Weight = req.Limit, req.Slots()
	}
	data := mustJSON(hd)
	var ops []any
	fenceOp := -1
	keyOps := make([]int, 0, len(plans)) // index of each key node's write
	for _, p := range plans {
		kp := l.keyPath(p.view.key)
		for _, w := range p.dead {
			ops = append(ops, &zk.DeleteRequest{Path: kp + "/" + w.name, Version: w.stat.Version})
		}
		for _, m := range p.deadMarks {
			ops = append(ops, &zk.DeleteRequest{Path: kp + "/" + m.name, Version: m.stat.Version})
		}
		ops = append(ops, l.replaceOps(req, p)...)
		for _, h := range p.view.leases() {
			if h.data.Owner != hash && !h.stale {
				continue // a live lease of another owner: room was counted
			}
			if h.stale && h.session != nil && !l.skipRenewalCheck {
				// Past its TTL as of the renewal node's version read: a
				// renewal since makes this transaction fail (session.go).
				ops = append(ops, &zk.CheckVersionRequest{Path: l.sessionPath(h.data.Session), Version: h.session.Version})
			}
			ops = append(ops, &zk.DeleteRequest{Path: kp + "/" + h.name, Version: h.stat.Version})
		}
		ops = append(ops, &zk.CreateRequest{Path: kp + "/" + name, Data: data, Acl: l.acl, Flags: zk.FlagEphemeral})
		if fenceOp < 0 {
			fenceOp = len(ops)
		}
		keyOps = append(keyOps, len(ops))
		ops = append(ops, &zk.SetDataRequest{Path: kp, Data: keyNodeData(p.view.key, 0), Version: p.view.kstat.Version})
		if p.mine != nil {
			ops = append(ops, &zk.DeleteRequest{Path: kp + "/" + p.mine.name, Version: -1})
		}
	}
	// What the transaction leaves if it commits: every key node one
	// version on, a new holder node (version 0).
	nodes := make([]written, len(plans))
	keyVersions := make([]int32, len(plans))
	for i, p := range plans {
		keyVersions[i] = p.view.kstat.Version + 1
		nodes[i] = written{keyVersion: keyVersions[i], name: name, data: hd}
	}
	if l.beforeTake != nil {
		l.beforeTake()
	}
	res, err := l.multi(ctx, ops)
	if isConflict(err) {
		return nil, err
	}
	if err != nil {
		// The transaction may have committed without the answer reaching
		// us: make sure the nodes it would have created end at the TTL.
		l.armUnconfirmed(hash, req.Keys, start.Add(req.TTL), keyVersions, name)
		return nil, l.unavailable(op, err)
	}
	if fenceOp >= len(res) || res[fenceOp].Stat == nil || res[fenceOp].Stat.Mzxid <= 0 {
		l.armUnconfirmed(hash, req.Keys, start.Add(req.TTL), keyVersions, name)
		return nil, l.unavailable(op, fmt.Errorf("multi answered %d results, without the key node's stat", len(res)))
	}
	fence := res[fenceOp].Stat.Mzxid
	for i, k := range keyOps {
		nodes[i].holderCzxid = fence // one transaction: one zxid
		if k < len(res) && res[k].Stat != nil {
			nodes[i].keyVersion = res[k].Stat.Version
		}
	}
	if fence >= lock.MaxFence {
		l.armTimer(fence, hash, req.Keys, start.Add(req.TTL), nodes) // in case the release fails
		l.releaseQuietly(ctx, req.Keys, hash, fence, req.Limit)
		return nil, fmt.Errorf("%s: fencing token (zxid) %d outside (0, %d): the ensemble's epoch is too large for JSON-safe tokens", op, fence, lock.MaxFence)
	}
	l.armTimer(fence, hash, req.Keys, start.Add(req.TTL), nodes)
	expires := start.Add(l.validity(req.TTL))
	if !l.opts.Now().Before(expires) {
		l.releaseQuietly(ctx, req.Keys, hash, fence, req.Limit)
		return nil, l.unavailable(op, fmt.Errorf("the acquisition took %v, leaving no validity of the %v TTL", l.opts.Since(start), req.TTL))
	}
	if v := l.log.V(1); v.Enabled() {
		v.Info("Acquired lease", "keys", req.Keys, "holder", req.Holder, "fence", fence, "validity", expires.Sub(start).String())
	}
	return lock.NewLease(req, fence, start, expires), nil
}

// releaseQuietly releases what the owner holds in the acquisition with
// fencing token fence (any of the owner's of the kind limit names when 0),
// best effort; the
// acquisition's timer is disarmed when it succeeds, else it stays to end the
// nodes at the TTL.
func (l *Locker) releaseQuietly(ctx context.Context, keys []string, hash string, fence int64, limit int) {
	cctx, cancel := l.cleanupContext(ctx)
	defer cancel()
	if _, err := l.releaseOwned(cctx, keys, hash, fence, limit); err != nil {
		l.log.V(2).Info("Best-effort release failed; the nodes end at the TTL or with the session", "keys", keys, "err", err.Error())
	}
}
