package zookeeper

import (
	"context"
	"fmt"
	"time"

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
	out := make([]lock.KeyState, len(keys))
	for i, v := range views {
		st := lock.KeyState{Key: keys[i], Fence: v.lastFence()}
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
