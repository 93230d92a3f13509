package zookeeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Release deletes the holder nodes of the lease (see lock.Locker): those of
// its owner token and, when lease.Fence is set, of that acquisition only (a
// later acquisition of the same owner is another lease), in one transaction;
// the deletions wake the watchers. It works from any Locker, also one that
// did not acquire the lease. It returns an error matching lock.ErrNotHeld
// when the lease held none of the keys.
func (l *Locker) Release(ctx context.Context, lease *lock.Lease) error {
	if err := validateLease(lease); err != nil {
		return err
	}
	hash := ownerHash(lease.Owner)
	op := fmt.Sprintf("release keys %q (fencing token %d)", lease.Keys, lease.Fence)
	// The TTL timer stays armed until the release is done: a release that
	// fails leaves the lease to end at its TTL, not to live with the session.
	if nodes := l.lastWritten(lease.Fence, hash, lease.Keys); nodes != nil {
		// This Locker wrote the nodes last: delete them without reading.
		_, err := l.multi(ctx, l.deleteOps(lease.Keys, nodes, nil))
		if err == nil {
			l.disarmTimer(lease.Fence, hash)
			if v := l.log.V(1); v.Enabled() {
				v.Info("Released lease", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
			}
			return nil
		}
		if !isConflict(err) {
			return l.unavailable(op, err)
		}
		// Something changed since (expired, renewed elsewhere): read.
	}
	live, err := l.releaseOwned(ctx, lease.Keys, hash, lease.Fence, lease.Limit)
	if err != nil {
		return l.unavailable(op, err)
	}
	if live == 0 {
		// Nothing, or only nodes that outlived the lease's TTL because their
		// Locker is gone (deleted now, as its timer would have).
		return fmt.Errorf("%s: %w: the lease expired or another owner took it", op, lock.ErrNotHeld)
	}
	if v := l.log.V(1); v.Enabled() {
		v.Info("Released lease", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
	}
	return nil
}

// deleteOps is the transaction that deletes the holder nodes of keys at the
// versions this Locker wrote (nodes, in keys order), each checked against
// the key node's version it left: exactly those nodes, or nothing. Only the
// keys at the indexes in only are included when only is not nil.
func (l *Locker) deleteOps(keys []string, nodes []written, only []int) []any {
	if only == nil {
		only = make([]int, len(keys))
		for i := range only {
			only[i] = i
		}
	}
	ops := make([]any, 0, 2*len(only))
	for _, i := range only {
		ops = append(ops,
			&zk.CheckVersionRequest{Path: l.keyPath(keys[i]), Version: nodes[i].keyVersion},
			&zk.DeleteRequest{Path: l.nodePath(keys[i], nodes[i].name), Version: nodes[i].holderVersion})
	}
	return ops
}

// ownedKey is a holder or slot node of the owner, as read.
type ownedKey struct {
	key    string
	holder *holderView // its name says which
	kstat  *zk.Stat
}

// path is the path of the owned node.
func (o *ownedKey) path(l *Locker) string { return l.nodePath(o.key, o.holder.name) }

// readOwned reads the key node and then the holder node of every key, and
// returns those the owner hash holds in the acquisition with fencing token
// fence (any of the owner's when fence is 0), plus the index of the first
// key it does not hold (-1 when it holds all).
//
// The key nodes are read first, on purpose: a write that checks the key
// node's version as read proves that no acquisition happened since, and every
// acquisition before that read had already replaced the holder node the
// second read sees. So a holder node read as the owner's is still the one
// read when the check passes (a recovery move writes the key node too).
func (l *Locker) readOwned(ctx context.Context, keys []string, hash string, fence int64, limit int) ([]*ownedKey, int, error) {
	kstats := make([]*zk.Stat, len(keys))
	errs := parallel(len(keys), func(i int) error {
		st, err := call(ctx, l, func(c *zk.Conn) (*zk.Stat, error) {
			ok, st, err := c.Exists(l.keyPath(keys[i]))
			if err == nil && !ok {
				st = nil
			}
			return st, err
		})
		if err != nil {
			return fmt.Errorf("read %s: %w", l.keyPath(keys[i]), err)
		}
		kstats[i] = st
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	// With the lease's token, each key's holder node and the owner's slot
	// node: the acquisition is the one with that token, whichever kind it
	// took, whatever Limit its Release or Renew gives (maxHolders may have
	// changed since). Without a token, the kind its limit names.
	names := []string{holderName, slotName(hash)}
	switch {
	case fence != 0:
	case limit > 1:
		names[0] = ""
	default:
		names[1] = ""
	}
	found := make([]*holderView, 2*len(keys))
	errs = parallel(2*len(keys), func(j int) error {
		i, name := j/2, names[j%2]
		if kstats[i] == nil || name == "" {
			return nil
		}
		type got struct {
			data []byte
			stat *zk.Stat
		}
		p := l.nodePath(keys[i], name)
		g, err := call(ctx, l, func(c *zk.Conn) (got, error) {
			d, st, err := c.Get(p)
			return got{d, st}, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		var d holderData
		if json.Unmarshal(g.data, &d) != nil || d.Owner != hash {
			return nil
		}
		h := &holderView{name: name, data: d, stat: g.stat}
		if fence != 0 && h.fence() != fence {
			return nil // a later acquisition of the same owner: another lease
		}
		found[j] = h
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	out := make([]*ownedKey, len(keys))
	for i := range keys {
		// Both only when an acquisition raced with a lagging read (its
		// write deletes the owner's other node): the later one.
		h := found[2*i]
		if s := found[2*i+1]; s != nil && (h == nil || s.fence() > h.fence()) {
			h = s
		}
		if h != nil {
			out[i] = &ownedKey{key: keys[i], holder: h, kstat: kstats[i]}
		}
	}
	var owned []*ownedKey
	var holders []*holderView
	first := -1
	for i, o := range out {
		if o != nil {
			owned = append(owned, o)
			holders = append(holders, o.holder)
		} else if first < 0 {
			first = i
		}
	}
	if err := l.readSessions(ctx, holders); err != nil {
		return nil, 0, err
	}
	return owned, first, nil
}

// releaseOwned deletes the holder nodes of keys that the owner hash holds in
// the acquisition with fencing token fence (any of the owner's when fence is
// 0), each checked against the key node's version read before it, so a node
// that another acquisition replaced is never deleted, and disarms this
// Locker's timers of the acquisitions it ended. It returns how many of the
// nodes it deleted were live: not the nodes of a lease whose
// TTL had passed on the ensemble's clock while its Locker was gone (see
// ttlPassed).
func (l *Locker) releaseOwned(ctx context.Context, keys []string, hash string, fence int64, limit int) (live int, err error) {
	synced := false
	for range maxTries {
		owned, _, err := l.readOwned(ctx, keys, hash, fence, limit)
		if err != nil {
			return 0, err
		}
		if len(owned) == 0 {
			if synced {
				l.disarmTimer(fence, hash)
				return 0, nil
			}
			// Not held, says this server: make sure it is not lagging.
			if err := l.sync(ctx); err != nil {
				return 0, err
			}
			synced = true
			continue
		}
		if live, err = l.liveCount(ctx, owned); err != nil {
			return 0, err
		}
		ops := make([]any, 0, 2*len(owned))
		for _, o := range owned {
			ops = append(ops,
				&zk.CheckVersionRequest{Path: l.keyPath(o.key), Version: o.kstat.Version},
				&zk.DeleteRequest{Path: o.path(l), Version: o.holder.stat.Version})
		}
		_, err = l.multi(ctx, ops)
		if err == nil {
			l.disarmTimer(fence, hash)
			for _, o := range owned {
				if f := o.holder.fence(); f != fence {
					l.disarmTimer(f, hash)
				}
			}
			return live, nil
		}
		if !isConflict(err) {
			return 0, fmt.Errorf("delete holder nodes: %w", err)
		}
		if err := l.sync(ctx); err != nil {
			return 0, err
		}
		synced = true
	}
	return 0, fmt.Errorf("the holder nodes of keys %q kept changing during %d attempts", keys, maxTries)
}

// liveCount returns how many of the owned holder nodes are live: in this
// Locker's session (its timer ends them at their TTL), or in another session
// with their TTL not yet passed on the ensemble's clock (mtime plus the TTL
// written, against the mtime of a node written now; only read when needed).
func (l *Locker) liveCount(ctx context.Context, owned []*ownedKey) (int, error) {
	session := l.conn.SessionID()
	var nowMs int64
	live := 0
	for _, o := range owned {
		if o.holder.stat.EphemeralOwner == session && session != 0 {
			live++
			continue
		}
		if nowMs == 0 {
			var err error
			if _, nowMs, err = l.serverNow(ctx); err != nil {
				return 0, err
			}
		}
		if end, ok := o.holder.endMs(); !ok || end >= nowMs {
			live++
		}
	}
	return live, nil
}

// Dequeue removes owner from the FIFO queues of keys (a waiter giving up);
// the deletion of its waiter nodes wakes the waiter behind it. It is not an
// error to dequeue an owner that is not queued.
func (l *Locker) Dequeue(ctx context.Context, keys []string, owner string) error {
	if err := lock.ValidateKeyList("keys", keys); err != nil {
		return err
	}
	if owner == "" {
		return &lock.InvalidRequestError{Field: "owner", Reason: "the owner token of the waiter is required"}
	}
	hash := ownerHash(owner)
	var paths []string
	names := make([][]string, len(keys))
	errs := parallel(len(keys), func(i int) error {
		ch, err := call(ctx, l, func(c *zk.Conn) ([]string, error) {
			ch, _, err := c.Children(l.keyPath(keys[i]))
			return ch, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		names[i] = ch
		return err
	})
	op := fmt.Sprintf("dequeue from keys %q", keys)
	if err := errors.Join(errs...); err != nil {
		return l.unavailable(op, err)
	}
	for i, ns := range names {
		for _, n := range ns {
			if _, h, ok := parseWaiter(n); ok && h == hash {
				paths = append(paths, l.keyPath(keys[i])+"/"+n)
			}
		}
	}
	errs = parallel(len(paths), func(i int) error {
		_, err := call(ctx, l, func(c *zk.Conn) (struct{}, error) { return struct{}{}, c.Delete(paths[i], -1) })
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		return err
	})
	if err := errors.Join(errs...); err != nil {
		return l.unavailable(op, err)
	}
	return nil
}

// leaseTimer ends one acquisition's lease at its TTL unless it is renewed
// first. It also remembers what this Locker last wrote for the lease, so that
// a renewal or release from this Locker can skip the reads (see written).
//
// Timers are per acquisition, keyed by the lease's fencing token: two leases
// of one owner (other keys, or the same keys taken again) each keep their
// own. A timer deletes only the node versions it was armed with, so it never
// ends a node that was created, moved or renewed after it was armed.
type leaseTimer struct {
	// id is the key in Locker.timers: the fencing token, or a negative
	// number for an acquisition whose outcome is unknown (unconfirmed).
	id       int64
	hash     string
	keys     []string
	deadline time.Time
	timer    func() bool // stops the timer
	// nodes is what this Locker last wrote for each key, in keys order.
	nodes []written
	// unconfirmed: nodes are what an acquisition whose answer was lost
	// would have written (the key node's version after it, a new holder
	// node); the timer reads the nodes to make sure they are that
	// acquisition's before it deletes them, and renewals and releases do not
	// use them.
	unconfirmed bool
	// failing is set once an attempt to end the lease failed because the
	// ensemble could not be reached: renewals read the nodes from then on.
	failing atomic.Bool
}

// written is what a Locker wrote for one key of a lease it holds: the key
// node's version after the acquisition (unchanged by renewals), the holder
// node's version and data. A write that checks both versions needs no read:
// the key node's version proves that no acquisition or move happened since,
// the holder node's version that the node is still the one written.
type written struct {
	// name is the lease's node on the key: holderName or a slot node.
	name          string
	keyVersion    int32
	holderVersion int32
	// holderCzxid is the holder node's creation zxid (0 when unknown): with
	// holderVersion it tells the node a renewal on the renewal node reads
	// from any other (session.go).
	holderCzxid int64
	data        holderData
}

// armTimer makes the Locker end the acquisition id (its fencing token) at
// deadline: delete the holder nodes of keys at exactly the versions in nodes.
// It replaces the acquisition's previous timer (a renewal), never another
// acquisition's.
func (l *Locker) armTimer(id int64, hash string, keys []string, deadline time.Time, nodes []written) {
	l.startTimer(&leaseTimer{id: id, hash: hash, keys: keys, deadline: deadline, nodes: nodes})
}

// armUnconfirmed makes the Locker end, at deadline, the nodes that an
// acquisition of keys whose outcome is unknown (its answer was lost) created
// if it committed: for each key the key node at version keyVersions[i] with
// the owner's node name (holder or slot) at version 0 in this Locker's
// session, created by the same write.
func (l *Locker) armUnconfirmed(hash string, keys []string, deadline time.Time, keyVersions []int32, name string) {
	nodes := make([]written, len(keys))
	for i, v := range keyVersions {
		nodes[i] = written{name: name, keyVersion: v}
	}
	l.timersMu.Lock()
	l.unconfirmedSeq--
	id := l.unconfirmedSeq
	l.timersMu.Unlock()
	l.startTimer(&leaseTimer{id: id, hash: hash, keys: keys, deadline: deadline, nodes: nodes, unconfirmed: true})
}

func (l *Locker) startTimer(lt *leaseTimer) {
	if l.closed.Load() {
		return
	}
	l.timersMu.Lock()
	defer l.timersMu.Unlock()
	if old := l.timers[lt.id]; old != nil {
		old.timer()
	}
	lt.timer = l.opts.AfterFunc(l.opts.Until(lt.deadline), func() { l.expire(lt) })
	l.timers[lt.id] = lt
}

// disarmTimer stops the timer of the owner hash's acquisition with fencing
// token fence (the lease was released); nothing for a fence that is not a
// fencing token (0: a lease given without its token).
func (l *Locker) disarmTimer(fence int64, hash string) {
	if fence <= 0 {
		return
	}
	l.timersMu.Lock()
	defer l.timersMu.Unlock()
	if t := l.timers[fence]; t != nil && t.hash == hash {
		t.timer()
		delete(l.timers, fence)
	}
}

// lastWritten returns what this Locker last wrote for the lease with fencing
// token fence on keys of the owner hash (nil when unknown), without
// disarming its timer. Only the owner token may renew or release: a lease
// with the right token but another owner gets nothing.
func (l *Locker) lastWritten(fence int64, hash string, keys []string) []written {
	if fence <= 0 {
		return nil
	}
	l.timersMu.Lock()
	defer l.timersMu.Unlock()
	if t := l.timers[fence]; t != nil && !t.unconfirmed && t.hash == hash && slices.Equal(t.keys, keys) {
		return t.nodes
	}
	return nil
}

// lastWrittenLive is lastWritten for a renewal: nil also once the
// acquisition's timer tried to end the lease and could not reach the
// ensemble, so that the renewal reads the nodes and checks the TTL on the
// ensemble's clock rather than revive, after an outage, a lease its holder
// was told has ended. (A renewal racing with the timer's first attempt still
// takes the fast path: see expire.)
func (l *Locker) lastWrittenLive(fence int64, hash string, keys []string) []written {
	if fence <= 0 {
		return nil
	}
	l.timersMu.Lock()
	defer l.timersMu.Unlock()
	if t := l.timers[fence]; t != nil && !t.unconfirmed && t.hash == hash && slices.Equal(t.keys, keys) && !t.failing.Load() {
		return t.nodes
	}
	return nil
}

// current tells whether lt is still the timer of its acquisition: not
// replaced by a renewal, not disarmed by a release, not stopped by Close.
func (l *Locker) current(lt *leaseTimer) bool {
	l.timersMu.Lock()
	defer l.timersMu.Unlock()
	return l.timers[lt.id] == lt
}

// claimed tells whether another timer than lt ends the acquisition with
// fencing token fence (this Locker knows that acquisition's outcome).
func (l *Locker) claimed(fence int64, lt *leaseTimer) bool {
	l.timersMu.Lock()
	defer l.timersMu.Unlock()
	t := l.timers[fence]
	return t != nil && t != lt
}

// expire ends an unrenewed lease: it deletes the holder nodes of its
// acquisition at exactly the versions the timer was armed with, so a node
// renewed, moved (into another Locker's session) or created (the same owner
// acquiring again) since is left alone. It retries while ZooKeeper is
// unreachable, until the session must have expired anyway, and stops as soon
// as it is no longer the acquisition's current timer.
//
// A renewal racing with the timer is decided by ZooKeeper's order of the two
// writes, both checked against the same versions: when the renewal's commits
// first the delete fails and the renewed lease lives (the node was never
// deleted, so no other owner could take a key meanwhile); when the delete
// commits first the renewal's write fails and the renewal reports the lease
// lost. Either way at most one valid holder.
func (l *Locker) expire(lt *leaseTimer) {
	if !l.current(lt) {
		return // renewed or released meanwhile
	}
	if !l.track() {
		return
	}
	defer l.wg.Done()
	if l.afterExpire != nil {
		defer l.afterExpire(lt.hash)
	}
	// The timer stays in l.timers while it works, so that a renewal or a
	// release that replaces or disarms it stops the retries; then it goes.
	defer func() {
		l.timersMu.Lock()
		if l.timers[lt.id] == lt {
			delete(l.timers, lt.id)
		}
		l.timersMu.Unlock()
	}()
	// The timer keeps trying while ZooKeeper is unreachable (a quorum loss
	// may outlast the session timeout without expiring the session): until
	// the nodes are gone, not its own any more, or the Locker closes.
	// Meanwhile acquirers treat the nodes as free once the TTL passed on
	// the ensemble's clock (staleHolder), and renewals do not revive them.
	warnAt := l.opts.Now().Add(l.SessionTimeout())
	b := l.opts.Backoff
	pending := make([]int, len(lt.keys))
	for i := range pending {
		pending[i] = i
	}
	deleted := 0
	for {
		if !l.current(lt) {
			return // renewed, released or re-armed since: not this timer's to end
		}
		ctx, cancel := context.WithTimeout(l.ctx, 2*l.opts.opTimeout)
		n, rest, err := l.endNodes(ctx, lt, pending)
		cancel()
		deleted += n
		pending = rest
		if err == nil {
			if deleted > 0 {
				l.log.V(1).Info("Lease expired: its TTL passed without a renewal", "keys", lt.keys, "fence", lt.id)
			}
			return
		}
		lt.failing.Store(true)
		if l.ctx.Err() != nil {
			return
		}
		if !warnAt.IsZero() && l.opts.Now().After(warnAt) {
			warnAt = time.Time{}
			l.log.V(2).Info("Ending an expired lease keeps failing; retrying (acquirers take the keys past the TTL meanwhile)", "keys", lt.keys, "ttlEnded", lt.deadline, "err", err.Error())
		}
		select {
		case <-l.ctx.Done():
			return
		case <-time.After(b.Step()):
		}
	}
}

// endNodes deletes the holder nodes of lt's keys at the indexes pending, at
// the versions lt was armed with: all in one transaction, or, when some key
// changed since (it is not this acquisition's any more), each other key on
// its own. It returns how many it deleted and the indexes still to end (when
// ZooKeeper failed, with the error).
func (l *Locker) endNodes(ctx context.Context, lt *leaseTimer, pending []int) (int, []int, error) {
	if lt.unconfirmed {
		var err error
		if pending, err = l.confirm(ctx, lt, pending); err != nil || len(pending) == 0 {
			return 0, pending, err
		}
	}
	_, err := l.multi(ctx, l.deleteOps(lt.keys, lt.nodes, pending))
	switch {
	case err == nil:
		return len(pending), nil, nil
	case !isConflict(err):
		return 0, pending, err
	}
	deleted := make([]bool, len(pending))
	errs := parallel(len(pending), func(j int) error {
		var err error
		deleted[j], err = l.endOne(ctx, lt, pending[j], len(pending) == 1)
		return err
	})
	n := 0
	var rest []int
	var failed []error
	for j, err := range errs {
		switch {
		case err != nil:
			rest = append(rest, pending[j])
			failed = append(failed, err)
		case deleted[j]:
			n++
		}
	}
	return n, rest, errors.Join(failed...)
}

// endOne deletes the node of lt's key at index i at the versions lt was
// armed with (tried: that delete failed already). A holder node whose key
// node changed since is not the acquisition's any more (another acquisition
// or a move replaced it). A slot node may still be: the key node is written
// by the acquisitions of the other slots too, so the slot node itself is
// read (after the key node, as readOwned does) and deleted when it is still
// the node lt's Locker wrote, at the same version: the creation zxid tells
// the node from one created again under its name (a later acquisition of
// the owner, a move), the version from one renewed since. A holder or slot
// node that a request with Preempt stopped since (preemptedSince) is still
// the acquisition's too, and ends at its TTL as any other.
func (l *Locker) endOne(ctx context.Context, lt *leaseTimer, i int, tried bool) (bool, error) {
	if !tried {
		_, err := l.multi(ctx, l.deleteOps(lt.keys, lt.nodes, []int{i}))
		switch {
		case err == nil:
			return true, nil
		case !isConflict(err):
			return false, err
		}
	}
	w := lt.nodes[i]
	if w.holderCzxid == 0 {
		return false, nil // not the node the timer was armed for any more
	}
	key := lt.keys[i]
	for range maxTries {
		kst, err := call(ctx, l, func(c *zk.Conn) (*zk.Stat, error) {
			ok, st, err := c.Exists(l.keyPath(key))
			if err == nil && !ok {
				st = nil
			}
			return st, err
		})
		if err != nil || kst == nil {
			return false, err
		}
		type got struct {
			data []byte
			stat *zk.Stat
		}
		g, err := call(ctx, l, func(c *zk.Conn) (got, error) {
			d, st, err := c.Get(l.nodePath(key, w.name))
			return got{d, st}, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		st := g.stat
		unchanged := w.name != holderName && st.Version == w.holderVersion
		if st.Czxid != w.holderCzxid || !unchanged && !preemptedSince(w, st, g.data, lt.hash) {
			return false, nil
		}
		_, err = l.multi(ctx, []any{
			&zk.CheckVersionRequest{Path: l.keyPath(key), Version: kst.Version},
			&zk.DeleteRequest{Path: l.nodePath(key, w.name), Version: st.Version},
		})
		if !isConflict(err) {
			return err == nil, err
		}
	}
	return false, nil // the key keeps changing: acquirers take the slot once its TTL passed
}

// confirm returns the indexes in pending of the keys whose nodes are those
// lt's acquisition (of unknown outcome) created if it committed; the others
// are not its, for good (versions only grow). A holder or slot node that
// another timer of this Locker ends (an acquisition whose outcome is known)
// is not.
func (l *Locker) confirm(ctx context.Context, lt *leaseTimer, pending []int) ([]int, error) {
	session := l.conn.SessionID()
	if session == 0 {
		// Which nodes are this Locker's cannot be told without a session.
		return pending, errors.New("no ZooKeeper session")
	}
	if err := l.sync(ctx); err != nil {
		return pending, err
	}
	keys := make([]string, len(pending))
	for j, i := range pending {
		keys[j] = lt.keys[i]
	}
	limit := 1 // the kind of node the acquisition took
	if len(lt.nodes) > 0 && lt.nodes[0].name != holderName {
		limit = 2
	}
	owned, _, err := l.readOwned(ctx, keys, lt.hash, 0, limit)
	if err != nil {
		return pending, err
	}
	byKey := map[string]*ownedKey{}
	for _, o := range owned {
		byKey[o.key] = o
	}
	var mine []int
	for _, i := range pending {
		o := byKey[lt.keys[i]]
		if o == nil {
			continue
		}
		h, w := o.holder, lt.nodes[i]
		ours := h.name == w.name && h.stat.Version == w.holderVersion && h.data.Fence == 0 &&
			h.stat.EphemeralOwner == session && !l.claimed(h.stat.Czxid, lt)
		if w.name == holderName {
			// Created by the write that left the key node at that version.
			ours = ours && o.kstat.Version == w.keyVersion && h.stat.Czxid == o.kstat.Mzxid
		}
		// A slot node: other owners' acquisitions write the key node too,
		// so it cannot tell; the owner's slot node in this session, never
		// moved or rewritten, that no acquisition of known outcome holds,
		// is one nobody was told they hold.
		if ours {
			// endOne deletes a slot node only at this creation zxid. The
			// nodes of an unconfirmed timer are its own (lastWritten
			// never hands them out), and only its expire reads them.
			lt.nodes[i].holderCzxid = h.stat.Czxid
			mine = append(mine, i)
		}
	}
	return mine, nil
}

// track registers a background goroutine unless the Locker is closed.
func (l *Locker) track() bool {
	l.timersMu.Lock()
	defer l.timersMu.Unlock()
	if l.closed.Load() {
		return false
	}
	l.wg.Add(1)
	return true
}

// validateLease checks a lease given to Renew or Release. Its Limit is not
// needed: its node is found whichever kind it is (see readOwned).
func validateLease(lease *lock.Lease) error {
	return lock.ValidateLease(lease)
}

// preemptedSince tells whether the node read (its stat st and data) is the
// node w this Locker wrote for the owner hash, changed since only by the
// write of a request with Preempt (which adds one to its version and sets
// holderData.Preempted): a preempted lease is no longer renewed, so no
// other write comes between.
func preemptedSince(w written, st *zk.Stat, data []byte, hash string) bool {
	var d holderData
	return st.Version == w.holderVersion+1 && json.Unmarshal(data, &d) == nil && d.Preempted && d.Owner == hash
}
