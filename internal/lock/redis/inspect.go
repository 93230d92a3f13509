package redis

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	goredis "github.com/redis/go-redis/v9"

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
	weight        int // slots taken (lock.Request.Weight; 1 when none recorded)
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
// waiters and their count come from the first node that answered. When some
// nodes did not answer, a lease seen on fewer nodes than its quorum, which
// the missing nodes could make up, is reported as a holder marked
// Unconfirmed (lock.HolderState): such a key is never reported free.
func (l *Locker) Inspect(ctx context.Context, keys []string) ([]lock.KeyState, error) {
	if err := l.validateKeys("keys", keys); err != nil {
		return nil, err
	}
	now := l.opts.Clock.Now()
	rk := l.redisKeys(keys, allParts...)
	maxHolders := l.inspectMaxHolders()
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

var _ lock.BatchInspector = (*Locker)(nil)

// inspectMaxHolders is how many holders per key a node reports: the oldest
// lock.MaxInspectHolders from one node; Redlock needs every node's full
// list to count the holders held on a quorum.
func (l *Locker) inspectMaxHolders() int {
	if len(l.nodes) > 1 {
		return lock.MaxLimit
	}
	return lock.MaxInspectHolders
}

// inspectChunkKeys bounds the lock keys one inspect script call of
// InspectMany reads: a script runs alone on its node, and a bounded call
// keeps other clients' commands (renewals, acquisitions) from waiting long
// behind it. The calls of one InspectMany still go in one pipeline.
const inspectChunkKeys = 128

// inspectTimePerKey is the node timeout InspectMany adds per lock key to the
// per-node timeout: a batch of many locks takes longer than one call (the
// script reads about seven Redis keys per lock key, and the request carries
// nine key names), on a node that serves everyone else meanwhile. 20,000
// locks get 5 s.
const inspectTimePerKey = 250 * time.Microsecond

// inspectChunk is one inspect script call of InspectMany: the locks (by
// index into its keys) whose keys it reads, in order.
type inspectChunk struct {
	locks []int
	keys  []string
}

// inspectBatch is one node's answer to InspectMany: by lock, its keys'
// views or why the node did not answer for it.
type inspectBatch struct {
	views [][]keyView
	errs  []error
}

// InspectMany reports what Inspect would for each set of keys, with one
// pipelined round trip per node for all of them (see lock.BatchInspector):
// the keys of many locks go to the inspect script together, a bounded number
// per call, and every call to a node in one pipeline. States and errors are
// by index; an invalid set of keys fails alone.
func (l *Locker) InspectMany(ctx context.Context, keys [][]string) ([][]lock.KeyState, []error) {
	out := make([][]lock.KeyState, len(keys))
	errs := make([]error, len(keys))
	var chunks []inspectChunk
	var cur inspectChunk
	total := 0
	for i, k := range keys {
		if err := l.validateKeys(fmt.Sprintf("keys[%d]", i), k); err != nil {
			errs[i] = err
			continue
		}
		if len(cur.keys)+len(k) > inspectChunkKeys && len(cur.locks) > 0 {
			chunks = append(chunks, cur)
			cur = inspectChunk{}
		}
		cur.locks = append(cur.locks, i)
		cur.keys = append(cur.keys, k...)
		total += len(k)
	}
	if len(cur.locks) > 0 {
		chunks = append(chunks, cur)
	}
	if len(chunks) == 0 {
		return out, errs
	}
	now := l.opts.Clock.Now()
	timeout := l.opts.nodeTimeout + time.Duration(total)*inspectTimePerKey
	perNode := fanOut(ctx, l.nodes, timeout, func(ctx context.Context, n *node) (inspectBatch, error) {
		return l.inspectPipeline(ctx, n, keys, chunks), nil
	})
	for _, c := range chunks {
		for _, i := range c.locks {
			var views [][]keyView
			var nodeErrs []error
			for _, pn := range perNode {
				if err := pn.val.errs[i]; err != nil {
					nodeErrs = append(nodeErrs, &lock.NodeError{Node: pn.node.name, Err: err})
					continue
				}
				views = append(views, pn.val.views[i])
			}
			if len(views) < l.quorum {
				errs[i] = l.failure(fmt.Sprintf("inspect keys %q", keys[i]), len(views), nodeErrs)
				continue
			}
			st := make([]lock.KeyState, len(keys[i]))
			for j, k := range keys[i] {
				st[j] = l.keyState(k, now, views, j)
			}
			out[i] = st
		}
	}
	return out, errs
}

// inspectPipeline runs the inspect script for every chunk in one pipeline
// on node n. When the node lost its script cache it retries once with EVAL
// (inspect writes nothing).
func (l *Locker) inspectPipeline(ctx context.Context, n *node, keys [][]string, chunks []inspectChunk) inspectBatch {
	maxHolders := l.inspectMaxHolders()
	exec := func(eval bool) []*goredis.Cmd {
		pipe := n.client.Pipeline()
		cmds := make([]*goredis.Cmd, len(chunks))
		for k, c := range chunks {
			rk := l.redisKeys(c.keys, allParts...)
			if eval {
				cmds[k] = inspectScript.Eval(ctx, pipe, rk, lock.MaxInspectWaiters, maxHolders)
			} else {
				cmds[k] = inspectScript.EvalSha(ctx, pipe, rk, lock.MaxInspectWaiters, maxHolders)
			}
		}
		_, _ = pipe.Exec(ctx) // per-command errors are read below
		return cmds
	}
	cmds := exec(false)
	for _, c := range cmds {
		if goredis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			cmds = exec(true)
			break
		}
	}
	b := inspectBatch{views: make([][]keyView, len(keys)), errs: make([]error, len(keys))}
	for k, c := range chunks {
		v, err := cmds[k].Result()
		var views []keyView
		if err != nil {
			err = fmt.Errorf("inspect script: %w", err)
		} else if views, err = decodeInspect(v, len(c.keys)); err != nil {
			err = fmt.Errorf("inspect script: %w", err)
		}
		at := 0
		for _, i := range c.locks {
			if err != nil {
				b.errs[i] = err
				continue
			}
			b.views[i] = views[at : at+len(keys[i])]
			at += len(keys[i])
		}
	}
	return b
}

// keyState merges the nodes' views of key i.
func (l *Locker) keyState(k string, now time.Time, views [][]keyView, i int) lock.KeyState {
	// The queue as a quorum of the nodes that answered holds it: a waiter
	// whose write missed one node (a timeout on a loaded machine) is still
	// in line on the others, so no single node's queue is the one to show.
	// The view whose length is the quorum-th longest is the queue that at
	// least a quorum of the answering nodes reaches (one node: its own).
	q := slices.Clone(views)
	slices.SortStableFunc(q, func(a, b []keyView) int { return cmp.Compare(b[i].queued, a[i].queued) })
	qv := q[min(l.quorum, len(q))-1][i]
	st := lock.KeyState{Key: k, Waiters: qv.waiters, Queued: qv.queued}
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
	// missing is how many nodes did not answer: a lease seen on fewer nodes
	// than its quorum may still hold the key on them.
	missing := len(l.nodes) - len(views)
	// quorumHolder merges the views of one owner's lease, held when at least
	// quorum nodes agree, and reported unconfirmed when fewer do but the
	// missing nodes could make up the quorum.
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
			hs.Weight = max(hs.Weight, h.Weight)
			if !h.Acquired.IsZero() {
				hs.Acquired = h.Acquired
			}
			if pttl >= 0 {
				expiries = append(expiries, now.Add(pttl))
			}
		}
		if n+missing < quorum || n == 0 {
			return hs, false
		}
		// The lease ends when fewer than its quorum still hold it. Seen on
		// fewer nodes than that, the answering nodes refuse the key until
		// the last of them lets it go.
		slices.SortFunc(expiries, func(a, b time.Time) int { return b.Compare(a) })
		switch {
		case n < quorum:
			hs.Unconfirmed = true
			if len(expiries) > 0 {
				hs.Expires = expiries[0]
			}
		case len(expiries) >= quorum:
			hs.Expires = expiries[quorum-1]
		}
		return hs, true
	}
	// The mutex holder: the owner on a quorum of nodes, or else the likeliest
	// owner that the missing nodes could give one (seen on the most nodes,
	// then the oldest), unconfirmed. At most one lease holds a mutex.
	var mutex *lock.HolderState
	mutexSeen := 0
	for owner, c := range counts {
		if c+missing < l.quorum {
			continue
		}
		hs, ok := quorumHolder(l.quorum, func(v keyView) (lock.HolderState, time.Duration, bool) {
			if v.owner != owner {
				return lock.HolderState{}, 0, false
			}
			h := lock.HolderState{Holder: v.holder, Fence: v.fence, Weight: 1}
			if v.acquired > 0 {
				h.Acquired = time.UnixMicro(v.acquired)
			}
			return h, v.pttl, true
		})
		if ok && (mutex == nil || c > mutexSeen || (c == mutexSeen && hs.Fence < mutex.Fence)) {
			mutex, mutexSeen = &hs, c
		}
	}
	var holders []lock.HolderState
	if mutex != nil {
		holders = append(holders, *mutex)
	}
	slots := 0
	if len(l.nodes) == 1 {
		// One node: its count is exact and its list is the oldest holders.
		slots = views[0][i].slots
		for _, h := range views[0][i].holders {
			holders = append(holders, h.state(now))
		}
	} else {
		// The semaphore's holders: every owner on its quorum of nodes, and
		// the owners the missing nodes could complete, unconfirmed. No more
		// slots than the limit are taken at once (taken: the holders'
		// weights), so the unconfirmed ones are counted only up to it: the
		// likeliest first (seen on the most nodes, then the oldest).
		type candidate struct {
			hs   lock.HolderState
			seen int
		}
		var maybe []candidate
		limit, taken := 0, 0
		for owner, c := range slotCounts {
			ownerLimit := 0
			for _, v := range views {
				for _, h := range v[i].holders {
					if h.owner == owner {
						ownerLimit = max(ownerLimit, h.limit)
					}
				}
			}
			q := l.quorumFor(ownerLimit)
			if c+missing < q {
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
			limit = max(limit, ownerLimit, 1) // as quorumFor reads a limit
			if hs.Unconfirmed {
				maybe = append(maybe, candidate{hs: hs, seen: c})
				continue
			}
			holders = append(holders, hs)
			taken += max(hs.Weight, 1)
		}
		slices.SortFunc(maybe, func(a, b candidate) int {
			return cmp.Or(cmp.Compare(b.seen, a.seen), cmp.Compare(a.hs.Fence, b.hs.Fence))
		})
		for _, m := range maybe {
			if taken >= limit {
				break
			}
			holders = append(holders, m.hs)
			taken += max(m.hs.Weight, 1)
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
	s := lock.HolderState{Holder: h.holder, Fence: h.fence, Weight: max(h.weight, 1)}
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
		if err != nil || len(hs)%7 != 0 {
			return nil, fmt.Errorf("key %d: holders: unexpected reply %v", i, e[8])
		}
		hd := decoder{s: hs}
		for j := 0; j < len(hs); j += 7 {
			views[i].holders = append(views[i].holders, slotView{
				owner:    hd.str(j),
				holder:   hd.str(j + 1),
				fence:    hd.int(j + 2),
				pttl:     time.Duration(hd.int(j+3)) * time.Millisecond,
				acquired: hd.int(j + 4),
				limit:    int(hd.int(j + 5)),
				weight:   int(hd.int(j + 6)),
			})
		}
		if hd.err != nil {
			return nil, fmt.Errorf("key %d: holders: %w", i, hd.err)
		}
	}
	return views, nil
}
