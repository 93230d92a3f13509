package zookeeper

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// holderData is the JSON data of a holder node.
type holderData struct {
	// Owner is ownerHash of the owner token.
	Owner string `json:"owner"`
	// Holder is the holder identity of the request.
	Holder string `json:"holder,omitempty"`
	// TTLMs is the lease TTL last set, in milliseconds, for a holder node
	// without Session; legacyTTLMs for one with (see session.go).
	TTLMs int64 `json:"ttlMs"`
	// Session is the name of the renewal node the lease is held on (its TTL
	// in the name): the lease lives until TTL after the later of this
	// node's and the renewal node's last writes. Empty for a node written
	// by an earlier release, judged by its own mtime and TTLMs.
	Session string `json:"session,omitempty"`
	// Fence is the lease's fencing token when the node was moved into
	// another session (recovery); 0 means the node's czxid.
	Fence int64 `json:"fence,omitempty"`
	// Acquired is when the lease was acquired, in milliseconds on the
	// ensemble's clock, when the node was moved; 0 means the node's ctime.
	Acquired int64 `json:"acquired,omitempty"`
	// Limit is the Request.Limit of a semaphore slot (a slot node); 0 in
	// a holder node (a mutex).
	Limit int `json:"limit,omitempty"`
	// Weight is how many of the semaphore's slots the lease takes
	// (Request.Slots) in a slot node; 0 in a holder node, and in a slot
	// node written by the previous release, which takes one (see weight).
	Weight int `json:"weight,omitempty"`
	// Preempted is set by a request with Preempt: the lease is no longer
	// renewed (lock.ErrPreempted) and ends with its release, its timer or
	// its TTL. The same write takes the node off its renewal node (Session
	// empty, TTLMs its TTL), so that the Locker's renewals of its other
	// leases no longer extend it.
	Preempted bool `json:"preempted,omitempty"`
}

// markData is the JSON data of a replacement mark: the holder identity of
// the waiter dropped and of the request that dropped it (for people reading
// the nodes), and how long the mark lasts from its last write (mtime), as
// the Locker that wrote it counts (markTTL).
type markData struct {
	Holder string `json:"holder,omitempty"`
	By     string `json:"by,omitempty"`
	TTLMs  int64  `json:"ttlMs,omitempty"`
}

// waiterData is the JSON data of a waiter node.
type waiterData struct {
	Owner  string `json:"owner"`
	Holder string `json:"holder,omitempty"`
	// Weight is the slots the waiter asks for (Request.Slots); 0 in a
	// waiter node written by the previous release, which asks for one
	// (see waiterView.weight).
	Weight int `json:"weight,omitempty"`
}

// keyNodeData is the data of a key node: the key, and after a recovery
// move the fencing token of the lease (which the node's mzxid then no longer
// is). Acquisitions write it without a token.
type keyNodeInfo struct {
	Key   string `json:"key"`
	Fence int64  `json:"fence,omitempty"`
}

func keyNodeData(key string, fence int64) []byte {
	return mustJSON(keyNodeInfo{Key: key, Fence: fence})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", v, err)) // plain structs of strings and ints always marshal
	}
	return b
}

// holderView is a holder or slot node as read.
type holderView struct {
	// name is the node's name: holderName, or slotName of its owner.
	name string
	data holderData
	stat *zk.Stat
	// stale: another owner's node whose TTL passed on the ensemble's clock
	// (see staleHolder), set by an acquisition: it counts as free, and the
	// acquisition deletes it at the version read.
	stale bool
	// session is the stat of the renewal node data.Session names (nil when
	// it does not name one, or it is gone or was not read: see
	// readSessions), sessTTLMs the TTL in its name.
	session   *zk.Stat
	sessTTLMs int64
}

// ttlMs is the lease's TTL in milliseconds (0 when unknown).
func (h *holderView) ttlMs() int64 {
	if h.data.Session != "" {
		return h.sessTTLMs
	}
	return h.data.TTLMs
}

// endMs is when the lease ends on the ensemble's clock: TTL after the last
// write of its holder node or, when it is held on a renewal node, of that
// node; ok is false when that cannot be told (data this package did not
// write, a renewal node that is gone or unread): such a lease is never taken
// over at a TTL, it ends with its release, its timer or its session.
func (h *holderView) endMs() (ms int64, ok bool) {
	if h.data.Owner == "?" {
		return 0, false
	}
	ttl := h.ttlMs()
	if ttl <= 0 {
		return 0, false
	}
	if h.data.Session == "" {
		return h.stat.Mtime + ttl, true
	}
	if h.session == nil {
		return 0, false
	}
	return max(h.stat.Mtime, h.session.Mtime) + ttl, true
}

// limit is how many leases the node's lease admits on its key: 1 for a
// holder node (or a slot node with data this package did not write).
func (h *holderView) limit() int {
	if h.name == holderName {
		return 1
	}
	return max(h.data.Limit, 1)
}

// weight is how many slots the node's lease takes on its key: 1 for a
// holder node, a slot node the previous release wrote (no weight in its
// data) or one with data this package did not write.
func (h *holderView) weight() int {
	if h.name == holderName {
		return 1
	}
	return max(h.data.Weight, 1)
}

// fence is the lease's fencing token.
func (h *holderView) fence() int64 {
	if h.data.Fence > 0 {
		return h.data.Fence
	}
	return h.stat.Czxid
}

// acquiredMs is when the lease was acquired, in ms on the ensemble's clock.
func (h *holderView) acquiredMs() int64 {
	if h.data.Acquired > 0 {
		return h.data.Acquired
	}
	return h.stat.Ctime
}

// waiterView is a waiter node as read.
type waiterView struct {
	name string
	// rank orders the queue (then ticket): arrival less Request.Boost, in
	// microseconds; a legacy waiter's is its ticket (see Priority).
	rank, ticket int64
	hash         string
	data         waiterData
	stat         *zk.Stat
}

// compare orders w and o in the queue: by rank, then ticket.
func (w *waiterView) compare(o *waiterView) int {
	return cmp.Or(cmp.Compare(w.rank, o.rank), cmp.Compare(w.ticket, o.ticket))
}

// weight is how many slots the waiter asks for: 1 for a waiter node the
// previous release wrote (no weight in its data) or one with unreadable
// data.
func (w *waiterView) weight() int { return max(w.data.Weight, 1) }

// aheadOf tells whether w is ahead of mine in the queue (of everyone when
// mine is nil: the request has no place yet).
func (w *waiterView) aheadOf(mine *waiterView) bool { return mine == nil || w.compare(mine) < 0 }

// markView is a replacement mark as read.
type markView struct {
	name  string
	hash  string
	ttlMs int64 // markData.TTLMs (0 when unreadable)
	stat  *zk.Stat
}

// keyView is what one read saw of one key.
type keyView struct {
	key     string
	exists  bool          // the key node exists
	kstat   *zk.Stat      // the key node's stat (when it exists)
	holder  *holderView   // the holder node (a mutex), if any
	slots   []*holderView // the slot nodes (a semaphore), oldest first
	waiters []*waiterView // in queue order: by rank, then ticket
	// marks are the replacement marks, by owner hash (nil when none).
	marks map[string]*markView
}

// leases are the leases holding the key, oldest (smallest fence) first: the
// holder node and the slot nodes (one kind only, but for an acquisition
// racing with a lagging read, which its write then refuses).
func (v *keyView) leases() []*holderView {
	if v.holder == nil {
		return v.slots
	}
	return append([]*holderView{v.holder}, v.slots...)
}

// lastFence is the token of the key's last acquisition (0 when none), given
// the key node's data when the key is free.
func (v *keyView) lastFence(keyData []byte) int64 {
	if ls := v.leases(); len(ls) > 0 {
		return ls[0].fence()
	}
	if !v.exists || v.kstat.Version == 0 {
		return 0 // never acquired
	}
	var info keyNodeInfo
	if json.Unmarshal(keyData, &info) == nil && info.Fence > 0 {
		return info.Fence // moved: the mzxid is the move's
	}
	return v.kstat.Mzxid
}

// tornReads is how many times readKeys reads again when a node listed was
// gone by the time it was read.
const tornReads = 3

// readKeys reads the key nodes' children (the holder or slots and the queue),
// then the holder, slot and waiter nodes and the replacement marks, all
// requests of a phase pipelined.
//
// A node listed but gone when read means a write landed between the two
// phases: the listing predates it, so a node that write created (a
// replacement mark beside the waiter it deleted) may be missing. Such a
// torn view is read again, up to tornReads times: a waiter whose own node
// vanished must see the mark that says why, or it would join the queue
// again at the back after it was replaced.
func (l *Locker) readKeys(ctx context.Context, keys []string) ([]*keyView, error) {
	for i := 0; ; i++ {
		views, torn, err := l.readKeysOnce(ctx, keys)
		if err != nil || !torn || i+1 >= tornReads {
			return views, err
		}
	}
}

// readKeysOnce is one read of readKeys; torn tells whether a node listed
// was gone when read.
func (l *Locker) readKeysOnce(ctx context.Context, keys []string) ([]*keyView, bool, error) {
	views := make([]*keyView, len(keys))
	names := make([][]string, len(keys))
	errs := parallel(len(keys), func(i int) error {
		v := &keyView{key: keys[i]}
		views[i] = v
		type res struct {
			children []string
			stat     *zk.Stat
		}
		r, err := call(ctx, l, func(c *zk.Conn) (res, error) {
			ch, st, err := c.Children(l.keyPath(keys[i]))
			return res{ch, st}, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", l.keyPath(keys[i]), err)
		}
		v.exists, v.kstat = true, r.stat
		names[i] = r.children
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		return nil, false, err
	}
	type task struct {
		view *keyView
		name string
	}
	var tasks []task
	for i, v := range views {
		for _, n := range names[i] {
			if isLeaseNode(n) {
				tasks = append(tasks, task{v, n})
			} else if _, _, ok := parseWaiter(n); ok {
				tasks = append(tasks, task{v, n})
			} else if _, ok := parseReplaced(n); ok {
				tasks = append(tasks, task{v, n})
			}
		}
	}
	type got struct {
		data []byte
		stat *zk.Stat
	}
	results := make([]*got, len(tasks))
	var gone atomic.Bool
	errs = parallel(len(tasks), func(i int) error {
		p := l.keyPath(tasks[i].view.key) + "/" + tasks[i].name
		g, err := call(ctx, l, func(c *zk.Conn) (*got, error) {
			d, st, err := c.Get(p)
			return &got{d, st}, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			gone.Store(true) // gone since the listing: as if never seen
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		results[i] = g
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		return nil, false, err
	}
	for i, t := range tasks {
		g := results[i]
		if g == nil {
			continue
		}
		if isLeaseNode(t.name) {
			h := &holderView{name: t.name, stat: g.stat}
			// A holder node with data the Locker did not write counts as
			// held by an unknown owner: never taken over, never released.
			if err := json.Unmarshal(g.data, &h.data); err != nil || h.data.Owner == "" {
				h.data = holderData{Owner: "?", Holder: "(unreadable holder node)"}
			}
			if t.name == holderName {
				t.view.holder = h
			} else {
				t.view.slots = append(t.view.slots, h)
			}
			continue
		}
		if hash, ok := parseReplaced(t.name); ok {
			if t.view.marks == nil {
				t.view.marks = map[string]*markView{}
			}
			var d markData
			_ = json.Unmarshal(g.data, &d) // unreadable: the reader's own markTTL
			t.view.marks[hash] = &markView{name: t.name, hash: hash, ttlMs: d.TTLMs, stat: g.stat}
			continue
		}
		rank, ticket, hash, _ := parseRanked(t.name)
		w := &waiterView{name: t.name, rank: rank, ticket: ticket, hash: hash, stat: g.stat}
		_ = json.Unmarshal(g.data, &w.data) // unreadable: no holder identity, weight 1
		t.view.waiters = append(t.view.waiters, w)
	}
	var holders []*holderView
	for _, v := range views {
		holders = append(holders, v.leases()...)
	}
	if err := l.readSessions(ctx, holders); err != nil {
		return nil, false, err
	}
	for _, v := range views {
		slices.SortFunc(v.slots, func(a, b *holderView) int { return cmp.Compare(a.fence(), b.fence()) })
		slices.SortFunc(v.waiters, func(a, b *waiterView) int {
			return cmp.Or(a.compare(b), cmp.Compare(a.hash, b.hash))
		})
	}
	return views, gone.Load(), nil
}

// sync makes the connected server catch up with the leader, so that the
// reads after it see every write that completed before it.
func (l *Locker) sync(ctx context.Context) error {
	_, err := call(ctx, l, func(c *zk.Conn) (string, error) { return c.Sync(l.root) })
	if err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	return nil
}

// serverNow writes the ticket node and returns its new mzxid (a fresh,
// globally ordered ticket) and mtime (the ensemble's clock, milliseconds).
func (l *Locker) serverNow(ctx context.Context) (ticket, nowMs int64, err error) {
	st, err := call(ctx, l, func(c *zk.Conn) (*zk.Stat, error) { return c.Set(l.ticketPath, nil, -1) })
	if err != nil {
		return 0, 0, fmt.Errorf("write %s: %w", l.ticketPath, err)
	}
	return st.Mzxid, st.Mtime, nil
}

// arrivalClock is what a Locker knows of the arrival node: the version it
// last wrote or read, and the arrival that write handed out (see arrive).
type arrivalClock struct {
	mu      sync.Mutex
	known   bool
	version int32
	last    int64
}

// arrive hands out the arrival of a waiter joining the queues: the write
// of the arrival node, at the version last known, whose mzxid is the
// waiter's ticket and whose mtime is the ensemble's clock (nowMs). The
// arrival, in microseconds, is max(previous arrival + 1, mtime): the
// ensemble's clock made monotonic, so equal boosts rank in ticket order.
// The node's data is the arrival of the write before it, so a reader
// computes the last arrival from the node's data and mtime; a Locker that
// knows the version (its own last join) writes without reading first. A
// write that loses the race to another join reads and writes again, until
// ctx ends: every lost race is another join's arrival, so the joins that
// race end, each in turn.
func (l *Locker) arrive(ctx context.Context) (ticket, arrival, nowMs int64, err error) {
	l.arrival.mu.Lock()
	known, version, last := l.arrival.known, l.arrival.version, l.arrival.last
	l.arrival.mu.Unlock()
	for ctx.Err() == nil {
		if !known {
			type got struct {
				data []byte
				stat *zk.Stat
			}
			g, err := call(ctx, l, func(c *zk.Conn) (got, error) {
				d, st, err := c.Get(l.arrivalPath)
				return got{d, st}, err
			})
			if errors.Is(err, zk.ErrNoNode) {
				err = l.createPersistent(ctx, l.arrivalPath, nil) // deleted by hand
			}
			if err != nil {
				return 0, 0, 0, fmt.Errorf("read %s: %w", l.arrivalPath, err)
			}
			if g.stat == nil {
				continue
			}
			version, last = g.stat.Version, nextArrival(g.data, g.stat)
		}
		st, err := call(ctx, l, func(c *zk.Conn) (*zk.Stat, error) {
			return c.Set(l.arrivalPath, []byte(strconv.FormatInt(last, 10)), version)
		})
		if errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNoNode) {
			known = false // another join came first
			continue
		}
		if err != nil {
			return 0, 0, 0, fmt.Errorf("write %s: %w", l.arrivalPath, err)
		}
		arrival = max(last+1, st.Mtime*1000)
		l.arrival.mu.Lock()
		if !l.arrival.known || st.Version > l.arrival.version { // not behind a join of this Locker's that ended first
			l.arrival.known, l.arrival.version, l.arrival.last = true, st.Version, arrival
		}
		l.arrival.mu.Unlock()
		return st.Mzxid, arrival, st.Mtime, nil
	}
	return 0, 0, 0, fmt.Errorf("write %s: other joins kept winning the race: %w", l.arrivalPath, ctx.Err())
}

// nextArrival is the last arrival the arrival node handed out, from its
// data (the arrival of the write before) and stat: none (0) for a node
// never written, else max(data + 1, mtime in microseconds).
func nextArrival(data []byte, st *zk.Stat) int64 {
	if st.Version == 0 {
		return 0
	}
	prev, _ := strconv.ParseInt(string(data), 10, 64) // unreadable: 0
	return max(prev+1, st.Mtime*1000)
}

// isConflict tells whether a write failed because the nodes changed since
// they were read (the caller reads again), rather than ZooKeeper failing.
func isConflict(err error) bool {
	return errors.Is(err, zk.ErrNodeExists) || errors.Is(err, zk.ErrBadVersion) ||
		errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrNotEmpty)
}

// multi runs one transaction.
func (l *Locker) multi(ctx context.Context, ops []any) ([]zk.MultiResponse, error) {
	return call(ctx, l, func(c *zk.Conn) ([]zk.MultiResponse, error) { return c.Multi(ops...) })
}

func msTime(ms int64) time.Time {
	if ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
