package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Renewal nodes: one write renews every lease of a Locker and TTL.
//
// A renewal node R/sessions/s-<ZooKeeper session id>-<TTL ms> is an
// EPHEMERAL node of the Locker's ZooKeeper session, one per TTL it holds
// leases with. A holder node written by this release names its renewal node
// (holderData.Session); the lease's TTL is the one in that name, and the
// lease ends TTL after the later of the holder node's and the renewal node's
// last writes (mtime), on the ensemble's clock. RenewAll writes the renewal
// node once and then reads (never writes) the holder nodes of the leases it
// renews, to check that each is still the node this Locker wrote: one quorum
// write per TTL and round whatever the number of leases, where each lease
// used to be one.
//
// Why this is safe:
//   - An acquirer that takes a holder node past its TTL judged by a renewal
//     node checks, in its acquisition transaction, the renewal node's version
//     it read. A renewal that wrote the node since makes the acquisition fail
//     (it reads again and finds the lease renewed); an acquisition that
//     committed before the renewal's write is seen by the renewal's reads,
//     which come after its write on the same session, and the lease is
//     reported lost.
//   - Every other change to a holder node (a release or recovery move by
//     another Locker, a new acquisition of the same owner) changes its
//     creation zxid or version, which the reads compare with what this
//     Locker wrote.
//   - The TTL timer of an acquisition is stopped before the renewal node is
//     written and armed again after (at the old deadline if the renewal
//     failed), so a timer never deletes a node that a running renewal is
//     about to report renewed.
//
// A lease held on the renewal node but no longer renewed (its holder stopped
// calling RenewAll for it) is still ended at its TTL by its timer; should
// that delete fail, acquirers see the lease live as long as the Locker
// renews other leases with the same TTL (its holder's Lease.Expires has
// passed all the same, so that delays the next holder, never admits two).
//
// Holder nodes on a renewal node carry ttlMs = legacyTTLMs, far in the
// future: a Locker of an earlier release, which judges a holder node by its
// own mtime and ttlMs only, never takes such a lease over at its TTL while
// the renewal node keeps it alive (it ends with its timer, a release or the
// ZooKeeper session).

// legacyTTLMs is the ttlMs written into holder nodes held on a renewal node
// (2^40 ms, about 35 years): see above.
const legacyTTLMs int64 = 1 << 40

const sessionPrefix = "s-"

// sessionName is the name of the renewal node of ZooKeeper session sid and ttl.
func sessionName(sid int64, ttl time.Duration) string {
	return fmt.Sprintf("%s%016x-%d", sessionPrefix, uint64(sid), ttl.Milliseconds()) //nolint:gosec // the id's bits, printed as they are

}

// parseSessionName returns the TTL (ms) in a renewal node's name; ok is false
// for a name this package does not write (a holder node naming one is never
// taken over at a TTL: its end is unknown).
func parseSessionName(name string) (ttlMs int64, ok bool) {
	rest, found := strings.CutPrefix(name, sessionPrefix)
	if !found || len(rest) < 18 || rest[16] != '-' {
		return 0, false
	}
	if _, err := strconv.ParseUint(rest[:16], 16, 64); err != nil {
		return 0, false
	}
	ttlMs, err := strconv.ParseInt(rest[17:], 10, 64)
	if err != nil || ttlMs <= 0 || ttlMs >= legacyTTLMs {
		return 0, false
	}
	return ttlMs, true
}

func (l *Locker) sessionPath(name string) string { return l.sessionsPath + "/" + name }

// sessions are the renewal nodes this Locker created, by name.
type sessions struct {
	mu    sync.Mutex
	known map[string]struct{}
}

// sessionFor returns the name of this Locker's renewal node for ttl in its
// current ZooKeeper session, creating the node the first time.
func (l *Locker) sessionFor(ctx context.Context, ttl time.Duration) (string, error) {
	sid := l.conn.SessionID()
	if sid == 0 {
		// Not connected yet (a new Locker) or between two sessions: a
		// request waits for the session (within the operation timeout).
		if _, err := call(ctx, l, func(c *zk.Conn) (bool, error) {
			ok, _, err := c.Exists(l.sessionsPath)
			return ok, err
		}); err != nil {
			return "", fmt.Errorf("read %s: %w", l.sessionsPath, err)
		}
		if sid = l.conn.SessionID(); sid == 0 {
			return "", errors.New("no ZooKeeper session")
		}
	}
	name := sessionName(sid, ttl)
	l.sess.mu.Lock()
	_, ok := l.sess.known[name]
	l.sess.mu.Unlock()
	if ok {
		return name, nil
	}
	_, err := call(ctx, l, func(c *zk.Conn) (string, error) {
		return c.Create(l.sessionPath(name), nil, zk.FlagEphemeral, l.acl)
	})
	if err != nil && !errors.Is(err, zk.ErrNodeExists) {
		return "", fmt.Errorf("create %s: %w", l.sessionPath(name), err)
	}
	l.sess.mu.Lock()
	if l.sess.known == nil {
		l.sess.known = map[string]struct{}{}
	}
	l.sess.known[name] = struct{}{}
	l.sess.mu.Unlock()
	return name, nil
}

// currentSession returns the name of the renewal node for ttl when this
// Locker created it in its current ZooKeeper session ("" when not).
func (l *Locker) currentSession(ttl time.Duration) string {
	sid := l.conn.SessionID()
	if sid == 0 {
		return ""
	}
	name := sessionName(sid, ttl)
	l.sess.mu.Lock()
	defer l.sess.mu.Unlock()
	if _, ok := l.sess.known[name]; ok {
		return name
	}
	return ""
}

// forgetSession drops a renewal node that is gone (its session expired, or
// an administrator deleted it): the next use creates it again.
func (l *Locker) forgetSession(name string) {
	l.sess.mu.Lock()
	delete(l.sess.known, name)
	l.sess.mu.Unlock()
}

// readSessions reads the renewal nodes the holder nodes name (each once), so
// that their end on the ensemble's clock can be told (see holderView.endMs).
func (l *Locker) readSessions(ctx context.Context, holders []*holderView) error {
	byName := map[string][]*holderView{}
	var names []string
	for _, h := range holders {
		if h == nil || h.data.Session == "" {
			continue
		}
		ttlMs, ok := parseSessionName(h.data.Session)
		if !ok {
			continue // never taken over at a TTL (see parseSessionName)
		}
		h.sessTTLMs = ttlMs
		if _, seen := byName[h.data.Session]; !seen {
			names = append(names, h.data.Session)
		}
		byName[h.data.Session] = append(byName[h.data.Session], h)
	}
	errs := parallel(len(names), func(i int) error {
		st, err := call(ctx, l, func(c *zk.Conn) (*zk.Stat, error) {
			ok, st, err := c.Exists(l.sessionPath(names[i]))
			if err == nil && !ok {
				st = nil
			}
			return st, err
		})
		if err != nil {
			return fmt.Errorf("read %s: %w", l.sessionPath(names[i]), err)
		}
		for _, h := range byName[names[i]] {
			h.session = st
		}
		return nil
	})
	return errors.Join(errs...)
}

// renewOnSession is RenewAll's fast path for the leases at indexes idx (all
// of ttl, held on this Locker's renewal node for ttl, with a live timer):
// one write of the renewal node, then one read of each holder node. It fills
// out and errs for the leases it renewed or that failed for good, and
// returns the indexes that need the read path (renew).
func (l *Locker) renewOnSession(ctx context.Context, leases []*lock.Lease, idx []int, ttl time.Duration, out []*lock.Lease, errs []error) []int {
	name := l.currentSession(ttl)
	if name == "" || l.noRenewalNode {
		return idx
	}
	type paused struct {
		i      int
		t      *leaseTimer
		hash   string
		keyOff int // index of the lease's first key in the flat read list
	}
	var ps []paused
	var slow []int
	var paths []string
	var want []written
	for _, i := range idx {
		lease := leases[i]
		hash := ownerHash(lease.Owner)
		t := l.pauseTimer(lease.Fence, hash, lease.Keys, name)
		if t == nil {
			slow = append(slow, i)
			continue
		}
		ps = append(ps, paused{i: i, t: t, hash: hash, keyOff: len(paths)})
		for k, key := range lease.Keys {
			paths = append(paths, l.nodePath(key, t.nodes[k].name))
			want = append(want, t.nodes[k])
		}
	}
	if len(ps) == 0 {
		return slow
	}
	resume := func(p paused) { l.rearm(p.t, p.t.deadline) }
	start := l.opts.Now()
	_, err := call(ctx, l, func(c *zk.Conn) (*zk.Stat, error) {
		return c.Set(l.sessionPath(name), nil, -1)
	})
	if err != nil {
		for _, p := range ps {
			resume(p)
		}
		if errors.Is(err, zk.ErrNoNode) {
			// The renewal node is gone (the session expired, or it was
			// deleted): the read path tells what is left.
			l.forgetSession(name)
			for _, p := range ps {
				slow = append(slow, p.i)
			}
			return slow
		}
		for _, p := range ps {
			lease := leases[p.i]
			errs[p.i] = l.unavailable(fmt.Sprintf("renew keys %q (fencing token %d)", lease.Keys, lease.Fence), err)
		}
		return slow
	}
	// The reads come after the write on the same session, so they see every
	// change committed before it (see the type comment above).
	ok := make([]bool, len(paths))
	readErrs := parallel(len(paths), func(j int) error {
		st, err := call(ctx, l, func(c *zk.Conn) (*zk.Stat, error) {
			found, st, err := c.Exists(paths[j])
			if err == nil && !found {
				st = nil
			}
			return st, err
		})
		if err != nil {
			return err
		}
		ok[j] = st != nil && st.Czxid == want[j].holderCzxid && st.Version == want[j].holderVersion
		return nil
	})
	for _, p := range ps {
		lease := leases[p.i]
		op := fmt.Sprintf("renew keys %q (fencing token %d)", lease.Keys, lease.Fence)
		var failed []error
		all := true
		for k := range lease.Keys {
			if e := readErrs[p.keyOff+k]; e != nil {
				failed = append(failed, e)
			}
			all = all && ok[p.keyOff+k]
		}
		switch {
		case len(failed) > 0:
			resume(p)
			errs[p.i] = l.unavailable(op, errors.Join(failed...))
		case !all:
			// Changed since this Locker wrote it: the read path decides.
			resume(p)
			slow = append(slow, p.i)
		default:
			if !l.rearm(p.t, start.Add(ttl)) {
				// Released (or Close) meanwhile: not this renewal's to report renewed.
				slow = append(slow, p.i)
				continue
			}
			out[p.i], errs[p.i] = l.renewedLease(op, lease, ttl, start)
		}
	}
	return slow
}

// pauseTimer stops the TTL timer of the owner hash's acquisition with fencing
// token fence on keys for a renewal on the renewal node name, and returns it
// (still the acquisition's timer, to be armed again with rearm); nil when
// the lease is not one this Locker holds on that node with a timer that has
// not fired.
func (l *Locker) pauseTimer(fence int64, hash string, keys []string, name string) *leaseTimer {
	if fence <= 0 {
		return nil
	}
	l.timersMu.Lock()
	defer l.timersMu.Unlock()
	t := l.timers[fence]
	if t == nil || t.unconfirmed || t.hash != hash || !slices.Equal(t.keys, keys) || t.failing.Load() {
		return nil
	}
	for _, w := range t.nodes {
		if w.data.Session != name || w.holderCzxid == 0 {
			return nil
		}
	}
	if !t.timer() {
		return nil // fired: its expire runs or ran
	}
	return t
}

// rearm arms the acquisition's timer t again, for deadline, unless a
// release, another renewal or Close replaced or dropped it meanwhile; it
// reports whether it did.
func (l *Locker) rearm(t *leaseTimer, deadline time.Time) bool {
	if l.closed.Load() {
		return false
	}
	l.timersMu.Lock()
	defer l.timersMu.Unlock()
	if l.timers[t.id] != t {
		return false
	}
	next := &leaseTimer{id: t.id, hash: t.hash, keys: t.keys, deadline: deadline, nodes: t.nodes}
	next.timer = l.opts.AfterFunc(l.opts.Until(deadline), func() { l.expire(next) })
	l.timers[t.id] = next
	return true
}
