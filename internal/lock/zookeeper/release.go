package zookeeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Release deletes the holder nodes the lease's owner token still holds, in
// one transaction (see lock.Locker); the deletions wake the watchers. It works
// from any Locker, also one that did not acquire the lease. It returns an
// error matching lock.ErrNotHeld when the owner held none of the keys.
func (l *Locker) Release(ctx context.Context, lease *lock.Lease) error {
	if err := validateLease(lease); err != nil {
		return err
	}
	hash := ownerHash(lease.Owner)
	op := fmt.Sprintf("release keys %q (fencing token %d)", lease.Keys, lease.Fence)
	// The TTL timer stays armed until the release is done: a release that
	// fails leaves the lease to end at its TTL, not to live with the session.
	if nodes := l.lastWritten(hash, lease.Keys); nodes != nil {
		// This Locker wrote the nodes last: delete them without reading.
		ops := make([]any, 0, 2*len(nodes))
		for i, w := range nodes {
			ops = append(ops,
				&zk.CheckVersionRequest{Path: l.keyPath(lease.Keys[i]), Version: w.keyVersion},
				&zk.DeleteRequest{Path: l.holderPath(lease.Keys[i]), Version: w.holderVersion})
		}
		_, err := l.multi(ctx, ops)
		if err == nil {
			l.disarmTimer(hash)
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
	_, live, err := l.releaseOwned(ctx, lease.Keys, hash, 0)
	if err != nil {
		return l.unavailable(op, err)
	}
	l.disarmTimer(hash)
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

// ownedKey is a holder node of the owner, as read.
type ownedKey struct {
	key    string
	holder *holderView
	kstat  *zk.Stat
}

// readOwned reads the key node and then the holder node of every key, and
// returns those the owner hash holds, plus the index of the first key it does
// not hold (-1 when it holds all).
//
// The key nodes are read first, on purpose: a write that checks the key
// node's version as read proves that no acquisition happened since, and every
// acquisition before that read had already replaced the holder node the
// second read sees. So a holder node read as the owner's is still the one
// read when the check passes (a recovery move writes the key node too).
func (l *Locker) readOwned(ctx context.Context, keys []string, hash string) ([]*ownedKey, int, error) {
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
	out := make([]*ownedKey, len(keys))
	errs = parallel(len(keys), func(i int) error {
		if kstats[i] == nil {
			return nil
		}
		type got struct {
			data []byte
			stat *zk.Stat
		}
		g, err := call(ctx, l, func(c *zk.Conn) (got, error) {
			d, st, err := c.Get(l.holderPath(keys[i]))
			return got{d, st}, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", l.holderPath(keys[i]), err)
		}
		var d holderData
		if json.Unmarshal(g.data, &d) != nil || d.Owner != hash {
			return nil
		}
		out[i] = &ownedKey{key: keys[i], holder: &holderView{data: d, stat: g.stat}, kstat: kstats[i]}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		return nil, 0, err
	}
	var owned []*ownedKey
	first := -1
	for i, o := range out {
		if o != nil {
			owned = append(owned, o)
		} else if first < 0 {
			first = i
		}
	}
	return owned, first, nil
}

// releaseOwned deletes the holder nodes of keys that the owner hash holds
// (only those in session session when it is not 0), each checked against the
// key node's version read before it, so a node that another acquisition
// replaced is never deleted. It returns how many it deleted, and how many of
// those were live: not the nodes of a lease whose TTL had passed on the
// ensemble's clock while its Locker was gone (counted only when session is 0,
// for Release; see foreignExpired).
func (l *Locker) releaseOwned(ctx context.Context, keys []string, hash string, session int64) (deleted, live int, err error) {
	synced := false
	for range maxTries {
		owned, _, err := l.readOwned(ctx, keys, hash)
		if err != nil {
			return 0, 0, err
		}
		if session != 0 {
			kept := owned[:0]
			for _, o := range owned {
				if o.holder.stat.EphemeralOwner == session {
					kept = append(kept, o)
				}
			}
			owned = kept
		}
		if len(owned) == 0 {
			if synced || session != 0 {
				return 0, 0, nil
			}
			// Not held, says this server: make sure it is not lagging.
			if err := l.sync(ctx); err != nil {
				return 0, 0, err
			}
			synced = true
			continue
		}
		live = len(owned)
		if session == 0 {
			if live, err = l.liveCount(ctx, owned); err != nil {
				return 0, 0, err
			}
		}
		ops := make([]any, 0, 2*len(owned))
		for _, o := range owned {
			ops = append(ops,
				&zk.CheckVersionRequest{Path: l.keyPath(o.key), Version: o.kstat.Version},
				&zk.DeleteRequest{Path: l.holderPath(o.key), Version: o.holder.stat.Version})
		}
		_, err = l.multi(ctx, ops)
		if err == nil {
			return len(owned), live, nil
		}
		if !isConflict(err) {
			return 0, 0, fmt.Errorf("delete holder nodes: %w", err)
		}
		if err := l.sync(ctx); err != nil {
			return 0, 0, err
		}
		synced = true
	}
	return 0, 0, fmt.Errorf("the holder nodes of keys %q kept changing during %d attempts", keys, maxTries)
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
		if o.holder.stat.Mtime+o.holder.data.TTLMs >= nowMs {
			live++
		}
	}
	return live, nil
}

// Dequeue removes owner from the FIFO queues of keys (a waiter giving up);
// the deletion of its waiter nodes wakes the waiter behind it. It is not an
// error to dequeue an owner that is not queued.
func (l *Locker) Dequeue(ctx context.Context, keys []string, owner string) error {
	if err := validateKeys("keys", keys); err != nil {
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

// leaseTimer ends a lease at its TTL unless it is renewed first. It also
// remembers what this Locker last wrote for the lease, so that a renewal or
// release from this Locker can skip the reads (see written).
type leaseTimer struct {
	keys     []string
	deadline time.Time
	timer    *time.Timer
	// nodes is what this Locker last wrote for each key, in keys order; nil
	// when unknown (an acquisition whose outcome is unknown).
	nodes []written
}

// written is what a Locker wrote for one key of a lease it holds: the key
// node's version after the acquisition (unchanged by renewals), the holder
// node's version and data. A write that checks both versions needs no read:
// the key node's version proves that no acquisition happened since, the
// holder node's version that the node is still the one written.
type written struct {
	keyVersion    int32
	holderVersion int32
	data          holderData
}

// armTimer makes the Locker delete the owner's holder nodes of keys that are
// still in its session at deadline, replacing the owner's previous timer.
func (l *Locker) armTimer(hash string, keys []string, deadline time.Time, nodes []written) {
	if l.closed.Load() {
		return
	}
	l.timersMu.Lock()
	defer l.timersMu.Unlock()
	if old := l.timers[hash]; old != nil {
		old.timer.Stop()
	}
	lt := &leaseTimer{keys: keys, deadline: deadline, nodes: nodes}
	lt.timer = time.AfterFunc(time.Until(deadline), func() { l.expire(hash, lt) })
	l.timers[hash] = lt
}

// disarmTimer stops the owner's timer (the lease was released).
func (l *Locker) disarmTimer(hash string) {
	l.timersMu.Lock()
	defer l.timersMu.Unlock()
	if t := l.timers[hash]; t != nil {
		t.timer.Stop()
		delete(l.timers, hash)
	}
}

// lastWritten returns what this Locker last wrote for the owner's lease on
// keys (nil when unknown), without disarming its timer.
func (l *Locker) lastWritten(hash string, keys []string) []written {
	l.timersMu.Lock()
	defer l.timersMu.Unlock()
	if t := l.timers[hash]; t != nil && slices.Equal(t.keys, keys) {
		return t.nodes
	}
	return nil
}

// expire ends an unrenewed lease: it deletes the owner's holder nodes that
// are still in this Locker's session (a node another Locker moved into its
// own session by renewing it is left alone). It retries while ZooKeeper is
// unreachable, until the session must have expired anyway.
func (l *Locker) expire(hash string, lt *leaseTimer) {
	l.timersMu.Lock()
	if l.timers[hash] != lt {
		l.timersMu.Unlock()
		return // renewed or released meanwhile
	}
	delete(l.timers, hash)
	l.timersMu.Unlock()
	if !l.track() {
		return
	}
	defer l.wg.Done()
	if l.afterExpire != nil {
		defer l.afterExpire(hash)
	}
	giveUp := time.Now().Add(l.SessionTimeout())
	b := l.opts.backoff
	for {
		ctx, cancel := context.WithTimeout(l.ctx, 2*l.opts.opTimeout)
		n, _, err := l.releaseOwned(ctx, lt.keys, hash, l.conn.SessionID())
		cancel()
		if err == nil {
			if n > 0 {
				l.log.V(1).Info("Lease expired: its TTL passed without a renewal", "keys", lt.keys)
			}
			return
		}
		if l.ctx.Err() != nil || time.Now().After(giveUp) {
			l.log.V(2).Info("Ending an expired lease failed; the session timeout ends it", "keys", lt.keys, "ttlEnded", lt.deadline, "err", err.Error())
			return
		}
		select {
		case <-l.ctx.Done():
			return
		case <-time.After(b.Step()):
		}
	}
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

// validateKeys checks a key list given outside a Request.
func validateKeys(field string, keys []string) error {
	if len(keys) == 0 {
		return &lock.InvalidRequestError{Field: field, Reason: fmt.Sprintf("at least one key is required (at most %d)", lock.MaxKeys)}
	}
	if len(keys) > lock.MaxKeys {
		return &lock.InvalidRequestError{Field: field, Reason: fmt.Sprintf("%d keys given, at most %d allowed", len(keys), lock.MaxKeys)}
	}
	return lock.ValidateKeys(keys)
}

// validateLease checks a lease given to Renew or Release.
func validateLease(lease *lock.Lease) error {
	if lease == nil {
		return &lock.InvalidRequestError{Field: "lease", Reason: "a lease is required, got nil"}
	}
	if err := lock.RequireMutex(lease.Limit); err != nil {
		return err
	}
	if lease.Owner == "" {
		return &lock.InvalidRequestError{Field: "lease.owner", Reason: "the owner token is required: only the owner may renew or release a lease"}
	}
	return validateKeys("lease.keys", lease.Keys)
}
