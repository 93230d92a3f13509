package redis

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// keyView is one node's view of one key.
type keyView struct {
	owner    string
	holder   string
	fence    int64
	pttl     time.Duration
	acquired int64 // server microseconds
	waiters  []lock.Waiter
}

// Inspect reports what Redis holds for each key: holder, fencing token,
// expiry, and the head of the FIFO queue (at most 10 live waiters, oldest
// first). In Redlock mode a key is held when one owner holds it on a majority
// of the nodes; its expiry is when fewer than a majority will still hold it;
// its fence is the lease's token, or for a free key the largest token any node
// issued (failed attempts included); waiters come from the first node that
// answered.
func (l *Locker) Inspect(ctx context.Context, keys []string) ([]lock.KeyState, error) {
	if err := validateKeys("keys", keys); err != nil {
		return nil, err
	}
	now := l.opts.clock.Now()
	rk := l.redisKeys(keys, "lock", "meta", "fence", "queue", "deadlines", "waiters")
	res := fanOut(ctx, l.nodes, l.opts.nodeTimeout, func(ctx context.Context, n *node) ([]keyView, error) {
		v, err := run(ctx, inspectScript, n.client, "inspect", rk, maxInspectWaiters)
		if err != nil {
			return nil, err
		}
		views, err := decodeInspect(v, len(keys))
		if err != nil {
			return nil, fmt.Errorf("inspect script: %w", err)
		}
		return views, nil
	})
	var views [][]keyView
	var errs []error
	for _, r := range res {
		if r.err != nil {
			errs = append(errs, r.nodeErr())
			continue
		}
		views = append(views, r.val)
	}
	if len(views) < l.quorum {
		return nil, l.failure(fmt.Sprintf("inspect keys %q", keys), len(views), errs)
	}
	out := make([]lock.KeyState, len(keys))
	for i, k := range keys {
		st := lock.KeyState{Key: k, Waiters: views[0][i].waiters}
		counts := map[string]int{}
		for _, v := range views {
			st.Fence = max(st.Fence, v[i].fence)
			if v[i].owner != "" {
				counts[v[i].owner]++
			}
		}
		for owner, c := range counts {
			if c < l.quorum {
				continue
			}
			st.Held = true
			st.Fence = 0
			var expiries []time.Time
			for _, v := range views {
				if v[i].owner != owner {
					continue
				}
				// Losing Redlock attempts may have raised other nodes'
				// counters: report the lease's own token.
				st.Fence = max(st.Fence, v[i].fence)
				st.Holder = v[i].holder
				if v[i].acquired > 0 {
					st.Acquired = time.UnixMicro(v[i].acquired)
				}
				if v[i].pttl >= 0 {
					expiries = append(expiries, now.Add(v[i].pttl))
				}
			}
			// The lease ends when fewer than a majority still hold it.
			slices.SortFunc(expiries, func(a, b time.Time) int { return b.Compare(a) })
			if len(expiries) >= l.quorum {
				st.Expires = expiries[l.quorum-1]
			}
		}
		out[i] = st
	}
	return out, nil
}

func decodeInspect(v any, n int) ([]keyView, error) {
	s, err := asSlice(v, n)
	if err != nil {
		return nil, err
	}
	views := make([]keyView, n)
	for i := range n {
		e, err := asSlice(s[i], 6)
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
		d := decoder{s: e}
		views[i] = keyView{
			owner:    d.str(0),
			holder:   d.str(1),
			fence:    d.int(2),
			pttl:     time.Duration(d.int(3)) * time.Millisecond,
			acquired: d.int(4),
		}
		if d.err != nil {
			return nil, fmt.Errorf("key %d: %w", i, d.err)
		}
		ws, err := asSlice(e[5], 0)
		if err != nil || len(ws)%2 != 0 {
			return nil, fmt.Errorf("key %d: waiters: unexpected reply %v", i, e[5])
		}
		wd := decoder{s: ws}
		for j := 0; j < len(ws); j += 2 {
			w := lock.Waiter{Holder: wd.str(j)}
			if us := wd.int(j + 1); us > 0 {
				w.Since = time.UnixMicro(us)
			}
			views[i].waiters = append(views[i].waiters, w)
		}
		if wd.err != nil {
			return nil, fmt.Errorf("key %d: waiters: %w", i, wd.err)
		}
	}
	return views, nil
}
