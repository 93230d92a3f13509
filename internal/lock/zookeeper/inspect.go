package zookeeper

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Inspect reports what ZooKeeper holds for each key, after a sync so that
// every write that completed before the call is seen: the leases holding
// each key (the holder node of a mutex, or a semaphore's slot nodes) in
// Holders, oldest first (at most lock.MaxInspectHolders; HolderCount counts
// them all), each with its fencing token, the slots it takes (Weight: 1
// for a mutex and for a slot the previous release wrote), acquisition time
// and expiry on the ensemble's clock (its node's or renewal node's last write plus the lease
// TTL); Holder, Fence, Acquired and Expires are the oldest's (for a free
// key, Fence is its last acquisition's token); the head of the queue (at
// most lock.MaxInspectWaiters waiters, in queue order: by arrival less
// Request.Boost, Since being when the waiter node was created) and the exact
// number of waiters (Queued). Both count live waiters only, by the rule
// acquisitions prune by: a waiter node not refreshed for the waiter TTL
// before the ensemble's clock is dead. When any key has waiters, the clock is
// read by writing the ticket node (as a request that finds a key queued for
// does), pipelined with the other reads.
func (l *Locker) Inspect(ctx context.Context, keys []string) ([]lock.KeyState, error) {
	if err := lock.ValidateKeyList("keys", keys); err != nil {
		return nil, err
	}
	op := fmt.Sprintf("inspect keys %q", keys)
	if err := l.sync(ctx); err != nil {
		return nil, l.unavailable(op, err)
	}
	views, err := l.readKeys(ctx, keys)
	if err != nil {
		return nil, l.unavailable(op, err)
	}
	queued := false
	for _, v := range views {
		queued = queued || len(v.waiters) > 0
	}
	// A free key's last token may be in its key node's data (after a move);
	// the last task reads the ensemble's clock when anyone waits.
	keyData := make([][]byte, len(keys))
	var nowMs int64
	errs := parallel(len(keys)+1, func(i int) error {
		if i == len(keys) {
			if !queued {
				return nil
			}
			var err error
			_, nowMs, err = l.serverNow(ctx)
			return err
		}
		if v := views[i]; len(v.leases()) > 0 || !v.exists || v.kstat.Version == 0 {
			return nil
		}
		d, err := call(ctx, l, func(c *zk.Conn) ([]byte, error) {
			d, _, err := c.Get(l.keyPath(keys[i]))
			return d, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		keyData[i] = d
		return err
	})
	if err := errors.Join(errs...); err != nil {
		return nil, l.unavailable(op, err)
	}
	cutoff := nowMs - l.opts.WaiterTTL.Milliseconds() - l.cfg.maxClockSkew().Milliseconds()
	out := make([]lock.KeyState, len(keys))
	for i, v := range views {
		st := lock.KeyState{Key: keys[i], Fence: v.lastFence(keyData[i])}
		for _, h := range v.leases() {
			hs := lock.HolderState{Holder: h.data.Holder, Fence: h.fence(), Acquired: msTime(h.acquiredMs()), Weight: h.weight()}
			if end, ok := h.endMs(); ok {
				hs.Expires = msTime(end)
			}
			if st.HolderCount == 0 {
				st.Held, st.Holder, st.Acquired, st.Expires = true, hs.Holder, hs.Acquired, hs.Expires
			}
			st.HolderCount++
			if len(st.Holders) < lock.MaxInspectHolders {
				st.Holders = append(st.Holders, hs)
			}
		}
		for _, w := range v.waiters {
			if w.stat.Mtime < cutoff {
				continue // dead: the next acquisition prunes it
			}
			st.Queued++
			if len(st.Waiters) < lock.MaxInspectWaiters {
				st.Waiters = append(st.Waiters, lock.Waiter{Holder: w.data.Holder, Since: msTime(w.stat.Ctime)})
			}
		}
		out[i] = st
	}
	return out, nil
}
