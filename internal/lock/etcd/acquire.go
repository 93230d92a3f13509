package etcd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// wait is Acquire (lock.Acquisitions) once req is prepared: it blocks until it
// holds every key of req or ctx ends (see
// lock.Locker). After each failed attempt it watches, from the revision the
// attempt read, the deletion of what blocks it (the busy holder key, or with
// Queue the waiter key just ahead of it), and tries again when that is
// deleted, after the next backoff step (WithBackoff) or, with Queue, a third
// of the waiter TTL, whichever comes first. Errors from etcd are retried too.
// With Queue it leaves the queues when ctx ends. When ctx ends the error wraps
// both ctx.Err() and the last attempt's error.
func (l *Locker) wait(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	var (
		watching waitHint
		events   clientv3.WatchChan
		stop     = func() {}
	)
	defer func() { stop() }()
	return lock.BlockingAcquire(ctx, &l.opts.Options, req, lock.Steps[clientv3.WatchResponse]{
		Attempt: func(ctx context.Context) (*lock.Lease, lock.Wake[clientv3.WatchResponse], error) {
			lease, hint, err := l.attempt(ctx, req)
			if err != nil && hint.key != "" && (hint.key != watching.key || hint.prefix != watching.prefix || events == nil) {
				// A watch on the same key is kept: it started earlier and
				// has seen everything since.
				stop()
				wctx, cancel := context.WithCancel(ctx)
				stop = cancel
				opts := []clientv3.OpOption{clientv3.WithRev(hint.rev + 1), clientv3.WithFilterPut()}
				if hint.prefix {
					opts = append(opts, clientv3.WithPrefix())
				}
				// WithRequireLeader: a member cut off from the leader ends
				// the watch instead of staying silent.
				events = l.etcd().Watch(clientv3.WithRequireLeader(wctx), hint.key, opts...)
				watching = hint
			}
			return lease, lock.Wake[clientv3.WatchResponse]{C: events, Now: hint.retry}, err
		},
		Woken: func(resp clientv3.WatchResponse, ok bool) {
			if !ok || resp.Canceled || resp.Err() != nil {
				// Re-established after the next attempt, from its revision.
				events, watching = nil, waitHint{}
			}
		},
		Dequeue:   func(ctx context.Context) error { return l.Dequeue(ctx, req.Keys, req.Owner) },
		Closed:    l.ctx.Done(),
		ClosedErr: errClosed,
	})
}

// waitHint is what a failed attempt waits for: the deletion of key (or of
// any key under it, with prefix), watched from rev+1.
type waitHint struct {
	key    string
	prefix bool
	rev    int64
	// retry: what blocked the attempt is already gone; try again at once.
	retry bool
}

// keyView is what an attempt read of one key.
type keyView struct {
	held      bool
	holderTag string
	holder    holderRecord
	holderMod int64    // the holder key's ModRevision
	fence     int64    // ModRevision of the fence record: the holder's fencing token (0 when absent)
	queue     []string // the waiter keys, in the queue's order (see sortQueue)
	queueRevs []int64  // the CreateRevision of each waiter key of queue
	// queueWeights are the slots each waiter of queue asks for (all 1
	// when the queue was read without its values, without Queue).
	queueWeights []int
	pos          int // index of the caller's waiter key in queue, -1 when absent
	// last is the largest arrival of the ranked waiters read (Queue only).
	last   int64
	own    *waiterRecord
	ownRev int64
	// ownPlace is the place of the caller's waiter key; ownBound its
	// headBound ("" when it is unranked, of an earlier version).
	ownPlace  place
	ownRanked bool
	ownBound  string
	// slots are the key's semaphore holders, oldest token first.
	slots []slot
	// replaced: a request with Replace dropped the caller's owner from
	// this key's queue (its replacement mark exists).
	replaced bool
}

// maxPasses bounds the transactions of one attempt: a queued request that
// finds itself at the head of every queue tries again with the head check.
const maxPasses = 3

// TryAcquire (lock.Acquisitions, over attempt) makes one attempt to take every
// key of req (see lock.Locker).
//
// A key is free for req when no lease holds it and its FIFO queue is empty
// or has req's owner at its head: a request without Queue does not jump a
// non-empty queue either (it fails with a *lock.HeldError whose Waiters
// counts the queue). With req.Queue a request that cannot take the keys joins
// (or refreshes its place in) the queue of every key, and must call again
// within the waiter TTL to keep it; so req.Owner is required with Queue.
// The HeldError's Holders is 1 when a lease holds the busy key, 0 when it is
// free but others are queued ahead; Waiters is the exact number of waiters
// (live: etcd deletes a waiter key when its lease expires), the caller
// included.
//
// With req.Limit above 1 the keys are semaphores: the leases holding one
// take req.Weight slots each (Request.Slots), and their weights never sum to
// more than Limit (nor than the smallest Limit a holder took its slot with),
// each with its own fencing token; a mutex lease (Limit 0 or 1) and a
// semaphore slot never hold one key at once (see semAttempt).
//
// attempt is one acquisition. It returns the lease, or what to wait for and
// the error.
func (l *Locker) attempt(ctx context.Context, req lock.Request) (*lock.Lease, waitHint, error) {
	start := l.opts.Now()
	op := fmt.Sprintf("acquire keys %q", req.Keys)
	tag := ownerTag(req.Owner)
	if err := l.connect(); err != nil {
		return nil, waitHint{}, l.unavailable(op, err)
	}
	// A session with at least half the TTL left: the acquisition is valid
	// for at least that long.
	s, err := l.sessionFor(ctx, req.TTL, start.Add(-req.TTL/2))
	if err != nil {
		return nil, waitHint{}, l.unavailable(op, err)
	}
	// The attempt number needs to be unique, not secret.
	rec := holderRecord{Holder: req.Holder, Lease: int64(s.id), TTLMilli: req.TTL.Milliseconds(), Acquired: start.UnixMilli(), Session: true, Attempt: rand.Uint64()} //nolint:gosec // G404: uniqueness only
	written := make([]string, len(req.Keys))
	for i, k := range req.Keys {
		written[i] = l.holderKey(k)
	}
	if req.Limit > 1 {
		rec.Limit, rec.Weight = req.Limit, req.Slots()
		for i, k := range req.Keys {
			written[i] = l.slotKey(k, tag)
		}
	}
	value := encodeValue(tag, rec)
	// failed ends an attempt whose transaction may have written the keys
	// (its answer was lost, or the acquisition cannot be used): they are
	// deleted in the background, unless the session is gone with them.
	failed := func(err error) (*lock.Lease, waitHint, error) {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			l.forget(s.id)
		} else {
			l.undoLater(written, value)
		}
		return nil, waitHint{}, l.unavailable(op, err)
	}
	if req.Limit > 1 {
		return l.semAttempt(ctx, req, tag, value, s, start, failed)
	}
	var heads []headCheck
	passes := policyPasses(req)
	for pass := range passes {
		resp, err := l.acquireTxn(ctx, req, tag, value, s.id, heads)
		if err != nil {
			return failed(err)
		}
		if resp.Succeeded {
			return l.took(req, resp, start, s, failed)
		}
		views, err := l.parseViews(req, tag, resp)
		if err != nil {
			return nil, waitHint{}, l.unavailable(op, err)
		}
		reread, err := l.policyStep(ctx, op, req, tag, views, pass == passes-1)
		if err != nil {
			return nil, waitHint{}, err
		}
		if reread {
			// The keys may be free for it now.
			heads = nil
			continue
		}
		rev := resp.Header.Revision
		if fence, ok := ownsAll(views, tag); ok && !preemptedWhileWaited(views, tag) {
			// The owner already holds every key (a restarted operator
			// acquiring again): re-put them on the session, as a new
			// acquisition with a new fencing token (the relet's revision).
			next, err := l.relet(ctx, req.Keys, tag, fence, s.id, rec, true, holderMods(views))
			if err != nil {
				return failed(err)
			}
			if next == 0 {
				continue
			}
			if next >= lock.MaxFence {
				return failed(fmt.Errorf("etcd revision %d is outside the fencing token range (0, %d)", next, lock.MaxFence))
			}
			lease, err := l.newLease(req, next, start, s)
			if err != nil {
				return failed(err)
			}
			return lease, waitHint{}, nil
		}
		held, hint := l.firstBusy(req, tag, views, rev)
		if held == nil {
			if req.Queue {
				heads = make([]headCheck, len(views))
				for i, v := range views {
					heads[i] = headCheck{rev: v.ownRev, bound: v.ownBound}
				}
			}
			continue
		}
		if req.Queue {
			if err := l.enqueue(ctx, req, tag, views, held, &hint); err != nil {
				return nil, waitHint{}, l.unavailable(op, err)
			}
		}
		return nil, hint, held
	}
	return nil, waitHint{}, fmt.Errorf("%s: %w: the keys changed under %d attempts in a row", op, lock.ErrNotAcquired, maxPasses)
}

// acquireTxn takes every key of req (a mutex) when it is free for req, or
// reads the keys' state. heads (Queue only) are the caller's places once it
// knows it heads every queue; nil on the first pass.
func (l *Locker) acquireTxn(ctx context.Context, req lock.Request, tag, value string, leaseID clientv3.LeaseID, heads []headCheck) (*clientv3.TxnResponse, error) {
	var (
		cmps     []clientv3.Cmp
		then, el []clientv3.Op
	)
	for i, k := range req.Keys {
		hk, sp := l.holderKey(k), l.slotPrefix(k)
		var head headCheck
		if i < len(heads) {
			head = heads[i]
		}
		// The key is free of holders of either kind: no holder key, and
		// no semaphore slot (an empty range compares as CreateRevision 0).
		cmps = append(cmps,
			clientv3.Compare(clientv3.CreateRevision(hk), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(sp).WithRange(clientv3.GetPrefixRangeEnd(sp)), "=", 0))
		cmps = append(cmps, l.queueCmps(req, k, tag, head)...)
		// The owner was not replaced in this key's queue.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(l.markKey(k, tag)), "=", 0))
		then = append(then,
			clientv3.OpPut(hk, value, clientv3.WithLease(leaseID)),
			clientv3.OpPut(l.fenceKey(k), ""))
		if req.Queue {
			then = append(then, clientv3.OpDelete(l.waiterKey(k, tag), clientv3.WithPrevKV()))
		}
		el = append(el, l.keyReads(req, k, tag)...)
	}
	tctx, cancel := l.opCtx(ctx)
	defer cancel()
	return l.etcd().Txn(tctx).If(cmps...).Then(then...).Else(el...).Commit()
}

// took ends an attempt whose transaction took the keys: the lease, and the
// waiter leases of the queue places it left revoked.
func (l *Locker) took(req lock.Request, resp *clientv3.TxnResponse, start time.Time, s *session, failed func(error) (*lock.Lease, waitHint, error)) (*lock.Lease, waitHint, error) {
	lease, err := l.acquired(req, resp, start, s)
	if err != nil {
		return failed(err)
	}
	if req.Queue {
		l.revokeLater(waiterLeases(resp)...)
	}
	return lease, waitHint{}, nil
}

// acquired turns a successful acquire transaction into the lease.
func (l *Locker) acquired(req lock.Request, resp *clientv3.TxnResponse, start time.Time, s *session) (*lock.Lease, error) {
	fence := resp.Header.Revision
	if fence <= 0 || fence >= lock.MaxFence {
		return nil, fmt.Errorf("etcd revision %d is outside the fencing token range (0, %d)", fence, lock.MaxFence)
	}
	return l.newLease(req, fence, start, s)
}

// newLease builds the lease of an acquisition that started at start on the
// session s.
func (l *Locker) newLease(req lock.Request, fence int64, start time.Time, s *session) (*lock.Lease, error) {
	// etcd counts the session's TTL from its last keepalive (or grant),
	// which started at s.refreshed: the keys are held at least until then
	// + TTL (less the drift allowance for clock rates); when the session
	// was confirmed during this attempt, at least until start + TTL. The
	// time the call took is already inside that window; subtracting it
	// again would end the lease early.
	expires := s.expires(req.TTL)
	if start.Before(s.refreshed) {
		expires = start.Add(req.TTL - drift(req.TTL))
	}
	now := l.opts.Now()
	validity := expires.Sub(now) // what is left now
	if validity <= 0 {
		// Held in etcd, but the caller could not rely on it for any time:
		// attempt undoes it.
		return nil, fmt.Errorf("the acquisition took %v, leaving no validity of the %v TTL (drift allowance %v)", now.Sub(start), req.TTL, drift(req.TTL))
	}
	if v := l.log.V(1); v.Enabled() {
		v.Info("Acquired lease", "keys", req.Keys, "holder", req.Holder, "fence", fence, "validity", validity.String())
	}
	return lock.NewLease(req, fence, start, expires), nil
}

// waiterLeases returns the etcd leases of the waiter keys an acquisition deleted.
func waiterLeases(resp *clientv3.TxnResponse) []clientv3.LeaseID {
	var out []clientv3.LeaseID
	for _, r := range resp.Responses {
		d := r.GetResponseDeleteRange()
		if d == nil {
			continue
		}
		for _, kv := range d.PrevKvs {
			if kv.Lease != 0 && !slices.Contains(out, clientv3.LeaseID(kv.Lease)) {
				out = append(out, clientv3.LeaseID(kv.Lease))
			}
		}
	}
	return out
}

// keyReads are the reads of one key that parseViews expects: its holder
// key, fence record, queue (oldest first), semaphore slots, with Queue the
// caller's waiter key, and last the caller's replacement mark.
func (l *Locker) keyReads(req lock.Request, k, tag string) []clientv3.Op {
	ops := []clientv3.Op{
		clientv3.OpGet(l.holderKey(k)),
		clientv3.OpGet(l.fenceKey(k), clientv3.WithKeysOnly()),
		l.queueRead(k, req.Queue),
		clientv3.OpGet(l.slotPrefix(k), clientv3.WithPrefix()),
	}
	if req.Queue {
		ops = append(ops, clientv3.OpGet(l.waiterKey(k, tag)))
	}
	return append(ops, clientv3.OpGet(l.markKey(k, tag), clientv3.WithKeysOnly()))
}

// queueRead reads the queue of key k, oldest first: with the values (the
// waiters' places) for a request with Queue, which takes its place in it,
// else the keys only (a request without Queue only needs to know whether
// anyone waits).
func (l *Locker) queueRead(k string, values bool) clientv3.Op {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
	if !values {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	return clientv3.OpGet(l.queuePrefix(k), opts...)
}

// headCheck is the caller's place in a key's queue that it found at the
// head: its waiter key's CreateRevision and headBound.
type headCheck struct {
	rev   int64
	bound string
}

// queueCmps is the queue condition of taking key k: without Queue an empty
// queue; with Queue and head.rev 0 nobody but the caller queued; else the
// caller's waiter key (created at head.rev) is alive and no waiter is ranked
// ahead of it: every value is above its bound (for a waiter of an earlier
// version, unranked: no ranked waiter and none older).
func (l *Locker) queueCmps(req lock.Request, k, tag string, head headCheck) []clientv3.Cmp {
	qp := l.queuePrefix(k)
	qend := clientv3.GetPrefixRangeEnd(qp)
	own := l.waiterKey(k, tag)
	switch {
	case !req.Queue:
		// An empty range compares as a key with CreateRevision 0.
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(qp).WithRange(qend), "=", 0)}
	case head.rev == 0:
		// Nobody but the caller queued: everything before and after its key is empty.
		return []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(qp).WithRange(own), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(own+"\x00").WithRange(qend), "=", 0)}
	case head.bound != "":
		return []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(own), "=", head.rev),
			clientv3.Compare(clientv3.Value(qp).WithRange(qend), ">", head.bound)}
	default:
		return []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(own), "=", head.rev),
			noRanked(qp, qend),
			clientv3.Compare(clientv3.CreateRevision(qp).WithRange(qend), ">", head.rev-1)}
	}
}

// parseViews reads the answers of keyReads for every key of req.
func (l *Locker) parseViews(req lock.Request, tag string, resp *clientv3.TxnResponse) ([]keyView, error) {
	stride := len(l.keyReads(req, "", tag))
	if len(resp.Responses) != stride*len(req.Keys) {
		return nil, fmt.Errorf("unexpected transaction reply: %d results for %d keys", len(resp.Responses), len(req.Keys))
	}
	views := make([]keyView, len(req.Keys))
	for i, k := range req.Keys {
		v := &views[i]
		v.pos = -1
		rs := resp.Responses[i*stride : (i+1)*stride]
		if kvs := rs[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
			v.held = true
			t, err := decodeValue(kvs[0].Value, &v.holder)
			if err != nil {
				return nil, fmt.Errorf("holder of key %q: %w", k, err)
			}
			v.holderTag, v.holderMod = t, kvs[0].ModRevision
		}
		if kvs := rs[1].GetResponseRange().GetKvs(); v.held && len(kvs) > 0 {
			v.fence = kvs[0].ModRevision
		}
		own := l.waiterKey(k, tag)
		queue, err := sortQueue(rs[2].GetResponseRange().GetKvs())
		if err != nil {
			return nil, fmt.Errorf("queue of key %q: %w", k, err)
		}
		for j, q := range queue {
			v.queue = append(v.queue, q.key)
			v.queueRevs = append(v.queueRevs, q.rev)
			v.queueWeights = append(v.queueWeights, q.weight)
			v.last = max(v.last, q.arrival)
			if q.key == own {
				v.pos = j
			}
		}
		slots, err := parseSlots(rs[3].GetResponseRange().GetKvs())
		if err != nil {
			return nil, fmt.Errorf("semaphore slot of key %q: %w", k, err)
		}
		v.slots = slots
		if req.Queue {
			if kvs := rs[4].GetResponseRange().GetKvs(); len(kvs) > 0 {
				var rec waiterRecord
				p, ranked, err := decodeWaiter(kvs[0].Value, &rec)
				if err != nil {
					return nil, fmt.Errorf("waiter of key %q: %w", k, err)
				}
				v.own, v.ownRev = &rec, kvs[0].CreateRevision
				v.ownPlace, v.ownRanked, v.ownBound = p, ranked, headBound(kvs[0].Value)
			}
		}
		v.replaced = len(rs[stride-1].GetResponseRange().GetKvs()) > 0
	}
	return views, nil
}

// holderMods are the ModRevisions of the holder keys the views read.
func holderMods(views []keyView) []int64 {
	mods := make([]int64, len(views))
	for i, v := range views {
		mods[i] = v.holderMod
	}
	return mods
}

// ownsAll reports whether the owner holds every key from one acquisition
// (one fencing token on every key), and that token.
func ownsAll(views []keyView, tag string) (int64, bool) {
	for _, v := range views {
		if !v.held || v.holderTag != tag || v.fence <= 0 || v.fence != views[0].fence {
			return 0, false
		}
	}
	return views[0].fence, true
}

// firstBusy returns the HeldError for the first key that is not free for
// req (nil when every key is free for it) and what to wait for. A key is busy
// for a mutex request while any lease holds it, and for a semaphore request
// while a mutex holds it or its free slots (the bound less the weights of
// the other slots) are fewer than the weights of the waiters ahead of it
// plus its own: strict FIFO by weight (Request.Weight).
func (l *Locker) firstBusy(req lock.Request, tag string, views []keyView, rev int64) (*lock.HeldError, waitHint) {
	for i, v := range views {
		k := req.Keys[i]
		he := &lock.HeldError{Key: k, Position: v.pos, Waiters: len(v.queue)}
		var (
			busy  bool
			watch waitHint
		)
		switch {
		case v.held:
			busy, watch = true, waitHint{key: l.holderKey(k), rev: rev}
			he.Holders, he.Holder, he.Fence = 1, v.holder.Holder, v.fence
		case len(v.slots) > 0:
			busy, watch = req.Limit <= 1, waitHint{key: l.slotPrefix(k), prefix: true, rev: rev}
			he.Holders, he.Holder, he.Fence = len(v.slots), v.slots[0].rec.Holder, v.slots[0].token
		}
		if req.Limit > 1 && !v.held {
			// A semaphore's turn: the weights of the waiters ahead and
			// its own fit in the free slots.
			free := freeSlots(v.slots, tag, req.Limit)
			ahead := 0
			if v.pos > 0 {
				for _, w := range v.queueWeights[:v.pos] {
					ahead += w
				}
			}
			slotsWatch := waitHint{key: l.slotPrefix(k), prefix: true, rev: rev}
			switch {
			case req.Queue && v.pos < 0 && len(v.queue) > 0:
				// Not queued yet: enqueue sets the position.
				return he, slotsWatch
			case !req.Queue && len(v.queue) > 0 && req.Slots() <= free:
				return he, waitHint{key: l.queuePrefix(k), prefix: true, rev: rev}
			case ahead+req.Slots() > free:
				return he, slotsWatch
			}
			continue
		}
		switch {
		case busy && req.Queue && v.pos > 0:
			// Only the head watches the holders: the others wait for the
			// waiter just ahead of them to leave (one wake-up per
			// handover, not a herd).
			return he, waitHint{key: v.queue[v.pos-1], rev: rev}
		case busy:
			return he, watch
		case req.Queue && v.pos > 0:
			return he, waitHint{key: v.queue[v.pos-1], rev: rev}
		case req.Queue && v.pos < 0 && len(v.queue) > 0:
			// Not queued yet: enqueue sets the position and the predecessor.
			return he, waitHint{key: v.queue[len(v.queue)-1], rev: rev}
		case !req.Queue && len(v.queue) > 0:
			return he, waitHint{key: l.queuePrefix(k), prefix: true, rev: rev}
		}
	}
	return nil, waitHint{}
}

// freeSlots is how many more slots owners other than tag may take: limit
// is the request's, less the weights of the other owners' slots (a slot
// of an earlier version takes one), and no slot is taken past the smallest
// limit a holder took its slot with. The owner's own slot does not count:
// its acquisition writes over it.
func freeSlots(slots []slot, tag string, limit int) int {
	others := 0
	for _, sl := range slots {
		if sl.tag == tag {
			continue
		}
		others += sl.rec.slots()
		if sl.rec.Limit > 0 {
			limit = min(limit, sl.rec.Limit)
		}
	}
	return limit - others
}

// enqueue puts the caller's waiter key into every queue it is missing from
// (all in one transaction, with one CreateRevision: the same place on every
// key) and refreshes the waiter lease of the places it has, then fixes the
// busy key's position in held and the predecessor in hint. A place whose
// value lacks its rank, or records another weight than req's (the caller
// asks for another number of slots now), is written again in the same
// transaction: same key, etcd lease and place.
func (l *Locker) enqueue(ctx context.Context, req lock.Request, tag string, views []keyView, held *lock.HeldError, hint *waitHint) error {
	var waiterLease clientv3.LeaseID
	var missing []int // no place in that queue, one without its rank, or another weight
	weight := 0       // mutex waiters record none: they ask for one slot
	if req.Limit > 1 {
		weight = req.Slots()
	}
	for i, v := range views {
		if v.own != nil {
			waiterLease = clientv3.LeaseID(v.own.Lease)
		}
		if !v.ownRanked || v.own.slots() != max(weight, 1) {
			missing = append(missing, i)
		}
	}
	if waiterLease != 0 {
		kctx, cancel := l.opCtx(ctx)
		_, err := l.keepAliveOnce(kctx, waiterLease)
		cancel()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			// The place just expired; the next call joins again at the back.
			return nil
		case err != nil:
			return fmt.Errorf("refresh waiter lease: %w", err)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	granted := false
	if waiterLease == 0 {
		gctx, cancel := l.opCtx(ctx)
		g, err := l.etcd().Grant(gctx, ttlSeconds(l.opts.WaiterTTL))
		cancel()
		if err != nil {
			return fmt.Errorf("grant waiter lease: %w", err)
		}
		waiterLease, granted = g.ID, true
	}
	p := l.placeOf(req, views, l.opts.Now())
	value := encodeWaiter(tag, p, waiterRecord{Holder: req.Holder, Lease: int64(waiterLease), Since: p.arrival / 1000, Weight: weight})
	busy := slices.Index(req.Keys, held.Key)
	var cmps []clientv3.Cmp
	var puts []clientv3.Op
	for _, k := range req.Keys {
		// Not replaced since the read: a dropped waiter does not join again.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(l.markKey(k, tag)), "=", 0))
	}
	for _, i := range missing {
		own := l.waiterKey(req.Keys[i], tag)
		// Absent, or (joined with an earlier version, or with another
		// weight) unchanged: it gets its rank and weight and keeps its
		// CreateRevision.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(own), "=", views[i].ownRev))
		puts = append(puts, clientv3.OpPut(own, value, clientv3.WithLease(waiterLease)))
	}
	qIndex := len(puts)
	puts = append(puts,
		l.queueRead(held.Key, true),
		clientv3.OpGet(l.holderKey(held.Key), clientv3.WithKeysOnly()))
	tctx, cancel := l.opCtx(ctx)
	resp, err := l.etcd().Txn(tctx).If(cmps...).Then(puts...).Commit()
	cancel()
	if err != nil {
		if granted {
			l.revokeLater(waiterLease)
		}
		return fmt.Errorf("join queue: %w", err)
	}
	if !resp.Succeeded {
		// A concurrent call with the same owner joined first: its place counts.
		if granted {
			l.revokeLater(waiterLease)
		}
		return nil
	}
	// Watch from the join's revision rather than the earlier read: etcd
	// serves a watch that starts at its current revision at once, while one
	// that starts in the past waits for its catch-up loop (every 100ms)
	// before it sees new events. The join read the queue and the holder key
	// at that revision, so nothing to wait for was deleted unnoticed; a
	// holder that left in between means: try again at once.
	rev := resp.Header.Revision
	own := l.waiterKey(held.Key, tag)
	queue, err := sortQueue(resp.Responses[qIndex].GetResponseRange().GetKvs())
	if err != nil {
		return fmt.Errorf("queue of key %q: %w", held.Key, err)
	}
	held.Waiters = len(queue)
	pos := slices.IndexFunc(queue, func(q queued) bool { return q.key == own })
	if pos < 0 {
		// Not in this queue after all (a concurrent Dequeue): keep the read's answer.
		return nil
	}
	held.Position = pos
	switch {
	case !views[busy].held && len(views[busy].slots) > 0 && (pos == 0 || req.Limit > 1):
		// Semaphore slots block it: a slot released frees its turn (a
		// semaphore waiter's turn comes while its position is below the
		// free slots, not only at the head). Watched from the read, which
		// saw the slots.
		*hint = waitHint{key: l.slotPrefix(held.Key), prefix: true, rev: hint.rev}
	case pos > 0:
		*hint = waitHint{key: queue[pos-1].key, rev: rev}
	case views[busy].held:
		gone := len(resp.Responses[qIndex+1].GetResponseRange().GetKvs()) == 0
		*hint = waitHint{key: l.holderKey(held.Key), rev: rev, retry: gone}
	default:
		// The waiters ahead left in between: try again at once.
		*hint = waitHint{retry: true}
	}
	return nil
}

// isDelete reports whether a watch event deleted a key.
func isDelete(ev *clientv3.Event) bool { return ev.Type == mvccpb.DELETE }
