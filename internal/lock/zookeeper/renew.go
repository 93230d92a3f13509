package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// errLostKey says which key a lease no longer holds.
type errLostKey struct{ key string }

// Error names the key.
func (e *errLostKey) Error() string {
	return fmt.Sprintf("key %q is no longer held by this lease", e.key)
}

// renewAll is the batch behind Renew and RenewAll (see lock.Renewals), with
// the meanings of lock.Locker's: it extends each lease to ttl from now when
// its owner token still holds every key, in the lease's acquisition when
// lease.Fence is set (once the owner took a key again, with a new token, the
// earlier lease is lost). The leases this Locker acquired or renewed last,
// on its renewal node for ttl, are renewed by one write of that node and a
// read of each holder node (see session.go). The others (acquired by an
// earlier Locker, with another TTL, or changed since) take the read path,
// each on its own, pipelined on the session's connection: it reads the
// nodes, and rewrites them onto the renewal node (moving them into this
// Locker's session when they are in another), keeping their fencing token;
// from the next round on they take the fast path. When a lease lost a key,
// the keys it still held are released and the error matches lock.ErrLost.
// When a request with Preempt stopped it (holderData.Preempted: the
// preemption's write changed the holder node, so both paths end up reading
// it) nothing is written and the error matches lock.ErrPreempted.
// When ZooKeeper could not be reached the error matches
// lock.ErrBackendUnavailable: the lease may still be held until its
// Expires, so the caller may try again. Results and errors go to out and
// errs at the leases' indexes.
func (l *Locker) renewAll(ctx context.Context, leases []*lock.Lease, idx []int, ttl time.Duration, out []*lock.Lease, errs []error) {
	slow := l.renewOnSession(ctx, leases, idx, ttl, out, errs)
	parallel(len(slow), func(j int) error {
		i := slow[j]
		out[i], errs[i] = l.renew(ctx, leases[i], ttl)
		return nil
	})
}

// renew is the read path of a renewal: it writes the holder nodes, onto this
// Locker's renewal node for ttl.
func (l *Locker) renew(ctx context.Context, lease *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
	op := fmt.Sprintf("renew keys %q (fencing token %d)", lease.Keys, lease.Fence)
	hash := ownerHash(lease.Owner)
	renewal, err := l.sessionFor(ctx, ttl)
	if err != nil {
		return nil, l.unavailable(op, err)
	}
	if nodes := l.lastWrittenLive(lease.Fence, hash, lease.Keys); nodes != nil {
		// This Locker wrote the nodes last: rewrite them without reading.
		// The versions checked are the ones the TTL timer deletes, so a
		// renewal racing with the timer either commits first (the timer's
		// delete then fails) or fails (see expire).
		start := l.opts.Now()
		ops := make([]any, 0, 2*len(nodes))
		next := make([]written, len(nodes))
		for i, w := range nodes {
			w.data.TTLMs, w.data.Session = legacyTTLMs, renewal
			next[i] = w
			next[i].holderVersion = w.holderVersion + 1 // what a setData makes it
			ops = append(ops,
				&zk.CheckVersionRequest{Path: l.keyPath(lease.Keys[i]), Version: w.keyVersion},
				&zk.SetDataRequest{Path: l.nodePath(lease.Keys[i], w.name), Data: mustJSON(w.data), Version: w.holderVersion})
		}
		res, err := l.multi(ctx, ops)
		switch {
		case err == nil:
			for i := range next {
				next[i].holderCzxid = 0 // unknown unless the answer says
				if k := 2*i + 1; k < len(res) && res[k].Stat != nil {
					next[i].holderVersion = res[k].Stat.Version
					next[i].holderCzxid = res[k].Stat.Czxid
				}
			}
			return l.renewed(op, lease, lease.Fence, hash, ttl, start, next)
		case err != nil && !isConflict(err):
			return nil, l.unavailable(op, err)
		}
		// Something changed since (moved by another Locker, expired): read.
	}
	synced := false
	for range maxTries {
		start := l.opts.Now()
		owned, first, err := l.readOwned(ctx, lease.Keys, hash, lease.Fence, lease.Limit)
		if err != nil {
			return nil, l.unavailable(op, err)
		}
		if first >= 0 {
			if !synced {
				// Lost, says this server: make sure it is not lagging.
				if err := l.sync(ctx); err != nil {
					return nil, l.unavailable(op, err)
				}
				synced = true
				continue
			}
			// The lease is gone; never keep half of it.
			l.releaseQuietly(ctx, lease.Keys, hash, lease.Fence, lease.Limit)
			l.log.Info("Lease lost", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
			return nil, fmt.Errorf("%s: %w: %w", op, lock.ErrLost, &errLostKey{lease.Keys[first]})
		}
		session := l.conn.SessionID()
		if expired, err := l.ttlPassed(ctx, owned, session); err != nil {
			return nil, l.unavailable(op, err)
		} else if expired {
			// Its Locker is gone (its timer with it) and the session not
			// timed out yet, or its timer could not reach the ensemble in
			// time: the lease ended at its TTL all the same.
			l.releaseQuietly(ctx, lease.Keys, hash, lease.Fence, lease.Limit)
			l.log.Info("Lease lost: its TTL passed without a renewal", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
			return nil, fmt.Errorf("%s: %w: its TTL passed without a renewal (on the ensemble's clock)", op, lock.ErrLost)
		}
		for _, o := range owned {
			if o.holder.data.Preempted {
				// A request with Preempt stopped it: extend nothing, the
				// lease stays valid to its Expires (its timer still ends
				// it, see endOne).
				return nil, preemptedError(op, lease, o.key)
			}
		}
		var ops []any
		next := make([]written, len(owned))
		holderOps := make([]int, len(owned)) // index of the holder's SetData, -1 for a move
		keyOps := make([]int, len(owned))    // index of the key node's SetData (a move), -1 for a check
		for i, o := range owned {
			d := o.holder.data
			d.TTLMs, d.Session = legacyTTLMs, renewal
			// The versions the transaction leaves (setData adds one, a
			// create starts at 0), unless its answer says otherwise.
			next[i] = written{name: o.holder.name, keyVersion: o.kstat.Version, holderVersion: o.holder.stat.Version + 1, holderCzxid: o.holder.stat.Czxid}
			if o.holder.stat.EphemeralOwner == session && session != 0 {
				keyOps[i], holderOps[i] = -1, len(ops)+1
				ops = append(ops,
					&zk.CheckVersionRequest{Path: l.keyPath(o.key), Version: o.kstat.Version},
					&zk.SetDataRequest{Path: o.path(l), Data: mustJSON(d), Version: o.holder.stat.Version})
				next[i].data = d
				continue
			}
			// Move the node into this session, keeping token and acquisition
			// time. The key node is written too (with the token, for
			// Inspect): its version changes with every move as with every
			// acquisition, so a Locker that checks the version it knows
			// notices that the holder node is no longer the one it wrote.
			d.Fence, d.Acquired = o.holder.fence(), o.holder.acquiredMs()
			next[i] = written{name: o.holder.name, keyVersion: o.kstat.Version + 1, holderVersion: 0, data: d} // czxid: the transaction's
			keyOps[i], holderOps[i] = len(ops), -1
			ops = append(ops,
				&zk.SetDataRequest{Path: l.keyPath(o.key), Data: keyNodeData(o.key, d.Fence), Version: o.kstat.Version},
				&zk.DeleteRequest{Path: o.path(l), Version: o.holder.stat.Version},
				&zk.CreateRequest{Path: o.path(l), Data: mustJSON(d), Acl: l.acl, Flags: zk.FlagEphemeral})
		}
		res, err := l.multi(ctx, ops)
		if isConflict(err) {
			if err := l.sync(ctx); err != nil {
				return nil, l.unavailable(op, err)
			}
			synced = true
			continue
		}
		if err != nil {
			return nil, l.unavailable(op, err)
		}
		stat := func(k int) *zk.Stat {
			if k < len(res) {
				return res[k].Stat
			}
			return nil
		}
		for i := range owned {
			if k := holderOps[i]; k >= 0 {
				if st := stat(k); st != nil {
					next[i].holderVersion = st.Version
				}
			}
			if k := keyOps[i]; k >= 0 {
				if st := stat(k); st != nil {
					next[i].keyVersion = st.Version
					next[i].holderCzxid = st.Mzxid // created in the same transaction
				}
			}
		}
		// The timer is the acquisition's: lease.Fence, or for a lease given
		// without its token the one of the nodes renewed.
		fence := lease.Fence
		if fence == 0 {
			fence = owned[0].holder.fence()
		}
		return l.renewed(op, lease, fence, hash, ttl, start, next)
	}
	return nil, l.unavailable(op, errors.New("the holder nodes kept changing during the renewal"))
}

// ttlPassed tells whether a holder node outlived its TTL on the ensemble's
// clock: its last write (mtime) plus the TTL it was written with is before
// the mtime of a node written now. Such a lease ended: its holder no longer
// relies on it and acquirers may take the key (see staleHolder), so a
// renewal must not revive it, whichever session the node is in: another
// Locker's that is gone (its timer with it), or this Locker's, whose timer
// could not end it in time (the ensemble unreachable past the TTL). The read
// path of a renewal only runs when this Locker cannot renew from what it
// wrote (see lastWrittenLive), so the extra write is rare. session is unused
// but for the log.
func (l *Locker) ttlPassed(ctx context.Context, owned []*ownedKey, session int64) (bool, error) {
	_, nowMs, err := l.serverNow(ctx)
	if err != nil {
		return false, err
	}
	for _, o := range owned {
		if end, ok := o.holder.endMs(); ok && end < nowMs {
			if v := l.log.V(2); v.Enabled() {
				v.Info("Holder node past its TTL on the ensemble's clock", "key", o.key,
					"ownSession", o.holder.stat.EphemeralOwner == session && session != 0)
			}
			return true, nil
		}
	}
	return false, nil
}

// renewed finishes a successful renewal that started at start: it re-arms
// the TTL timer of the acquisition fence with the node versions the renewal
// wrote and returns the renewed lease. The renewal's write committed at
// versions no older than those the previous timer deletes, so that timer can
// no longer delete these nodes: success here means the nodes were renewed
// and stay until this timer, a release or the session ends them.
func (l *Locker) renewed(op string, lease *lock.Lease, fence int64, hash string, ttl time.Duration, start time.Time, nodes []written) (*lock.Lease, error) {
	l.armTimer(fence, hash, lease.Keys, start.Add(ttl), nodes)
	return l.renewedLease(op, lease, ttl, start)
}

// renewedLease is the lease renewed for ttl by a round trip that started at
// start, or an error when nothing of its validity is left.
func (l *Locker) renewedLease(op string, lease *lock.Lease, ttl time.Duration, start time.Time) (*lock.Lease, error) {
	expires := start.Add(l.validity(ttl))
	if !l.opts.Now().Before(expires) {
		return nil, l.unavailable(op, fmt.Errorf("the renewal took %v, leaving no validity of the %v TTL", l.opts.Since(start), ttl))
	}
	next := *lease
	next.TTL = ttl
	next.Expires = expires
	if v := l.log.V(4); v.Enabled() {
		v.Info("Renewed lease", "keys", lease.Keys, "fence", lease.Fence, "validity", expires.Sub(start).String())
	}
	return &next, nil
}

func validateRenew(lease *lock.Lease, ttl time.Duration) error {
	if err := validateLease(lease); err != nil {
		return err
	}
	return lock.ValidateTTL(ttl)
}
