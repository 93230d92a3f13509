package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Inspect reports what ZooKeeper holds for each key, after a sync so that
// every write that completed before the call is seen: holder, fencing token
// (the lease's, or for a free key its last acquisition's), acquisition time
// and expiry on the ensemble's clock (the holder node's last write plus the
// lease TTL), and the head of the FIFO queue (at most 10 waiters, oldest
// first, Since being when the waiter node was created). Waiters that stopped
// refreshing are listed until the next acquisition of the key prunes them.
func (l *Locker) Inspect(ctx context.Context, keys []string) ([]lock.KeyState, error) {
	if err := validateKeys("keys", keys); err != nil {
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
	// A free key's last token may be in its key node's data (after a move).
	keyData := make([][]byte, len(keys))
	errs := parallel(len(keys), func(i int) error {
		if v := views[i]; v.holder != nil || !v.exists || v.kstat.Version == 0 {
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
	out := make([]lock.KeyState, len(keys))
	for i, v := range views {
		st := lock.KeyState{Key: keys[i], Fence: v.lastFence(keyData[i])}
		if h := v.holder; h != nil {
			st.Held = true
			st.Holder = h.data.Holder
			st.Acquired = msTime(h.acquiredMs())
			st.Expires = msTime(h.stat.Mtime).Add(time.Duration(h.data.TTLMs) * time.Millisecond)
		}
		for _, w := range v.waiters {
			if len(st.Waiters) == maxInspectWaiters {
				break
			}
			st.Waiters = append(st.Waiters, lock.Waiter{Holder: w.data.Holder, Since: msTime(w.stat.Ctime)})
		}
		out[i] = st
	}
	return out, nil
}
