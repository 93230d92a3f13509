package redis

import (
	"cmp"
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
	queued   int
	slots    int // live semaphore holders
	holders  []slotView
}

// slotView is one node's view of one semaphore holder.
type slotView struct {
	owner, holder string
	fence         int64
	pttl          time.Duration
	acquired      int64 // server microseconds
	limit         int
}

// Inspect reports what Redis holds for each key: its holders (a mutex's one,
// or a semaphore's, oldest first, at most lock.MaxInspectHolders) and their
// exact count, fencing tokens, expiries, the head of the FIFO queue (at most
// lock.MaxInspectWaiters live waiters, oldest first) and the exact number of
// live waiters. In Redlock mode a lease holds a key when its owner holds it
// on the lease's quorum of nodes (a majority for a mutex; see quorumFor for a
// semaphore, whose limit each node records); its expiry is when fewer than
// that quorum will still hold it; its fence is the lease's token, and for a
// free key the largest token any node issued (failed attempts included);
// waiters and their count come from the first node that answered.
func (l *Locker) Inspect(ctx context.Context, keys []string) ([]lock.KeyState, error) {
	if err := validateKeys("keys", keys); err != nil {
		return nil, err
	}
	now := l.opts.clock.Now()
	rk := l.redisKeys(keys, allParts...)
	// One node reports the oldest holders; Redlock needs every node's full
	// list to count the holders held on a quorum.
	maxHolders := lock.MaxInspectHolders
	if len(l.nodes) > 1 {
		maxHolders = lock.MaxLimit
	}
	res := fanOut(ctx, l.nodes, l.opts.nodeTimeout, func(ctx context.Context, n *node) ([]keyView, error) {
		v, err := run(ctx, inspectScript, n.client, "inspect", rk, lock.MaxInspectWaiters, maxHolders)
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
		out[i] = l.keyState(k, now, views, i)
	}
	return out, nil
}

// keyState merges the nodes' views of key i.
func (l *Locker) keyState(k string, now time.Time, views [][]keyView, i int) lock.KeyState {
	st := lock.KeyState{Key: k, Waiters: views[0][i].waiters, Queued: views[0][i].queued}
	var free int64
	counts := map[string]int{}
	slotCounts := map[string]int{}
	for _, v := range views {
		free = max(free, v[i].fence)
		if v[i].owner != "" {
			counts[v[i].owner]++
		}
		for _, h := range v[i].holders {
			slotCounts[h.owner]++
		}
	}
	// quorumHolder merges the views of one owner's lease, held when at least
	// quorum nodes agree.
	quorumHolder := func(quorum int, get func(v keyView) (lock.HolderState, time.Duration, bool)) (lock.HolderState, bool) {
		var hs lock.HolderState
		var expiries []time.Time
		n := 0
		for _, v := range views {
			h, pttl, ok := get(v[i])
			if !ok {
				continue
			}
			n++
			// Losing Redlock attempts may have raised other nodes'
			// counters: report the lease's own token.
			hs.Fence = max(hs.Fence, h.Fence)
			hs.Holder = h.Holder
			if !h.Acquired.IsZero() {
				hs.Acquired = h.Acquired
			}
			if pttl >= 0 {
				expiries = append(expiries, now.Add(pttl))
			}
		}
		if n < quorum {
			return hs, false
		}
		// The lease ends when fewer than its quorum still hold it.
		slices.SortFunc(expiries, func(a, b time.Time) int { return b.Compare(a) })
		if len(expiries) >= quorum {
			hs.Expires = expiries[quorum-1]
		}
		return hs, true
	}
	var holders []lock.HolderState
	for owner, c := range counts {
		if c < l.quorum {
			continue
		}
		hs, ok := quorumHolder(l.quorum, func(v keyView) (lock.HolderState, time.Duration, bool) {
			if v.owner != owner {
				return lock.HolderState{}, 0, false
			}
			h := lock.HolderState{Holder: v.holder, Fence: v.fence}
			if v.acquired > 0 {
				h.Acquired = time.UnixMicro(v.acquired)
			}
			return h, v.pttl, true
		})
		if ok {
			holders = append(holders, hs)
		}
	}
	slots := 0
	if len(l.nodes) == 1 {
		// One node: its count is exact and its list is the oldest holders.
		slots = views[0][i].slots
		for _, h := range views[0][i].holders {
			holders = append(holders, h.state(now))
		}
	} else {
		for owner, c := range slotCounts {
			limit := 0
			for _, v := range views {
				for _, h := range v[i].holders {
					if h.owner == owner {
						limit = max(limit, h.limit)
					}
				}
			}
			q := l.quorumFor(limit)
			if c < q {
				continue
			}
			hs, _ := quorumHolder(q, func(v keyView) (lock.HolderState, time.Duration, bool) {
				for _, h := range v.holders {
					if h.owner == owner {
						return h.state(now), h.pttl, true
					}
				}
				return lock.HolderState{}, 0, false
			})
			holders = append(holders, hs)
			slots++
		}
	}
	// Fencing tokens are strictly increasing: their order is the acquisition order.
	slices.SortFunc(holders, func(a, b lock.HolderState) int { return cmp.Compare(a.Fence, b.Fence) })
	st.HolderCount = len(holders)
	if len(l.nodes) == 1 {
		st.HolderCount = slots
		if views[0][i].owner != "" {
			st.HolderCount++
		}
	}
	if len(holders) > lock.MaxInspectHolders {
		holders = holders[:lock.MaxInspectHolders]
	}
	st.Fence = free
	if len(holders) > 0 {
		st.Holders = holders
		st.Held = true
		st.Holder, st.Fence, st.Acquired, st.Expires = holders[0].Holder, holders[0].Fence, holders[0].Acquired, holders[0].Expires
	}
	return st
}

func (h slotView) state(now time.Time) lock.HolderState {
	s := lock.HolderState{Holder: h.holder, Fence: h.fence}
	if h.acquired > 0 {
		s.Acquired = time.UnixMicro(h.acquired)
	}
	if h.pttl >= 0 {
		s.Expires = now.Add(h.pttl)
	}
	return s
}

func decodeInspect(v any, n int) ([]keyView, error) {
	s, err := asSlice(v, n)
	if err != nil {
		return nil, err
	}
	views := make([]keyView, n)
	for i := range n {
		e, err := asSlice(s[i], 9)
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
			queued:   int(d.int(6)),
			slots:    int(d.int(7)),
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
		hs, err := asSlice(e[8], 0)
		if err != nil || len(hs)%6 != 0 {
			return nil, fmt.Errorf("key %d: holders: unexpected reply %v", i, e[8])
		}
		hd := decoder{s: hs}
		for j := 0; j < len(hs); j += 6 {
			views[i].holders = append(views[i].holders, slotView{
				owner:    hd.str(j),
				holder:   hd.str(j + 1),
				fence:    hd.int(j + 2),
				pttl:     time.Duration(hd.int(j+3)) * time.Millisecond,
				acquired: hd.int(j + 4),
				limit:    int(hd.int(j + 5)),
			})
		}
		if hd.err != nil {
			return nil, fmt.Errorf("key %d: holders: %w", i, hd.err)
		}
	}
	return views, nil
}
