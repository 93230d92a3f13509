package zookeeper

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// The queue rules Request.Replace and Request.Preempt (see the package
// documentation, Replace and Preempt).

// markTTL is how long a replacement mark this Locker writes tells its owner
// so, on the ensemble's clock: two waiter TTLs, so that a waiter that calls
// again within its waiter TTL learns it whatever the skew.
func (l *Locker) markTTL() time.Duration { return 2 * l.opts.WaiterTTL }

// markLive tells whether the replacement mark m still holds at nowMs (the
// mtime of a node written now): its last write plus the longer of the TTL
// its writer gave it and this Locker's markTTL (Lockers configured with
// different waiter TTLs keep a mark for the longer), plus the skew allowance.
func (l *Locker) markLive(m *markView, nowMs int64) bool {
	ttl := max(m.ttlMs, l.markTTL().Milliseconds())
	return m.stat.Mtime+ttl+l.cfg.maxClockSkew().Milliseconds() >= nowMs
}

// checkReplaced fails the attempt with lock.ErrReplaced when a request with
// Replace dropped the owner hash's waiter from the queue of one of req's
// keys and the mark it left is still live on the ensemble's clock
// (markLive). Reading that clock costs one write, only for an owner that
// has a mark; a mark past its time is deleted with the attempt's next write
// (deadMarks).
func (l *Locker) checkReplaced(ctx context.Context, req lock.Request, hash string, plans []*keyPlan) error {
	var own []*keyPlan
	for _, p := range plans {
		if p.view.marks[hash] != nil {
			own = append(own, p)
		}
	}
	if len(own) == 0 {
		return nil
	}
	op := fmt.Sprintf("acquire keys %q", req.Keys)
	_, nowMs, err := l.serverNow(ctx)
	if err != nil {
		return l.unavailable(op, err)
	}
	for _, p := range own {
		if l.markLive(p.view.marks[hash], nowMs) {
			l.leaveQueues(ctx, plans)
			return fmt.Errorf("%s: %w: a newer request took its place in the queue of key %q", op, lock.ErrReplaced, p.view.key)
		}
	}
	for _, p := range own {
		p.deadMarks = append(p.deadMarks, p.view.marks[hash])
	}
	return nil
}

// leaveQueues deletes the waiter nodes of the attempt's owner still in
// plans (at the versions read) when it was replaced: one it wrote again
// after its first was dropped, from a read that missed the mark, would
// otherwise stay in the queue until its waiter TTL ran out. Best effort: a
// node changed or gone meanwhile is left to that.
func (l *Locker) leaveQueues(ctx context.Context, plans []*keyPlan) {
	var ops []any
	for _, p := range plans {
		if p.mine != nil && p.mine.stat != nil {
			ops = append(ops, &zk.DeleteRequest{Path: l.keyPath(p.view.key) + "/" + p.mine.name, Version: p.mine.stat.Version})
		}
	}
	if len(ops) > 0 {
		_, _ = l.multi(ctx, ops)
	}
}

// dropOlder applies Request.Replace to plans (after the attempt joined or
// refreshed its place, so its ticket is known): the live waiters of other
// owners with a smaller ticket than the request's (every one when it is not
// queued) move from live to replaced, so the request is judged as if they
// were gone; replaceOps drops them in the attempt's next write.
func dropOlder(plans []*keyPlan) {
	mine := int64(math.MaxInt64)
	for _, p := range plans {
		if p.mine != nil {
			mine = min(mine, p.mine.ticket)
		}
	}
	for _, p := range plans {
		live := p.live[:0:0]
		for _, w := range p.live {
			if w.ticket < mine {
				p.replaced = append(p.replaced, w)
			} else {
				live = append(live, w)
			}
		}
		p.live = live
		if len(p.replaced) == 0 {
			continue
		}
		// A mark past its time of an owner replaced again is written
		// again, not deleted.
		dead := p.deadMarks[:0:0]
		for _, m := range p.deadMarks {
			if !replacing(p, m.hash) {
				dead = append(dead, m)
			}
		}
		p.deadMarks = dead
	}
}

// replacing tells whether the plan drops a waiter of the owner hash.
func replacing(p *keyPlan, hash string) bool {
	return slices.ContainsFunc(p.replaced, func(w *waiterView) bool { return w.hash == hash })
}

// replaceOps drops the plan's replaced waiters: each waiter node is deleted
// (a waiter that left since makes the transaction fail, and the attempt
// reads again) and its owner's replacement mark is created, or written
// again when one is left from an earlier replacement. Marks are persistent
// nodes: they outlive the waiter's session (an operator restart), and
// acquirers delete them once past their time (markLive).
func (l *Locker) replaceOps(req lock.Request, p *keyPlan) []any {
	if len(p.replaced) == 0 {
		return nil
	}
	kp := l.keyPath(p.view.key)
	ops := make([]any, 0, 2*len(p.replaced))
	marked := map[string]bool{}
	for _, w := range p.replaced {
		// Any version: a refresh since keeps the same waiter (its name
		// carries its ticket), and should not make the drop fail.
		ops = append(ops, &zk.DeleteRequest{Path: kp + "/" + w.name, Version: -1})
		if marked[w.hash] {
			continue // two waiter nodes of one owner: one mark
		}
		marked[w.hash] = true
		data := mustJSON(markData{Holder: w.data.Holder, By: req.Holder, TTLMs: l.markTTL().Milliseconds()})
		name := replacedName(w.hash)
		if m := p.view.marks[w.hash]; m != nil {
			ops = append(ops, &zk.SetDataRequest{Path: kp + "/" + name, Data: data, Version: m.stat.Version})
		} else {
			ops = append(ops, &zk.CreateRequest{Path: kp + "/" + name, Data: data, Acl: l.acl})
		}
	}
	return ops
}

// policyOps is the transaction of a refused request's queue rules: its
// replaceOps and, with Preempt, preemptOps on every key, with a check that
// the request's own waiter nodes are still there, so that a request a newer
// one replaced meanwhile drops and preempts nobody (the transaction fails
// and the attempt, reading again, finds its mark). Nil when there is
// nothing to do.
func (l *Locker) policyOps(req lock.Request, hash string, plans []*keyPlan) []any {
	var ops []any
	for _, p := range plans {
		ops = append(ops, l.replaceOps(req, p)...)
		if req.Preempt {
			ops = append(ops, l.preemptOps(p, hash)...)
		}
	}
	if len(ops) == 0 {
		return nil
	}
	for _, p := range plans {
		if p.mine != nil {
			ops = append(ops, &zk.CheckVersionRequest{Path: l.nodePath(p.view.key, p.mine.name), Version: -1})
		}
	}
	return ops
}

// preemptOps marks the live leases of other owners on the plan's key
// preempted (holderData.Preempted), each at the holder node's version read,
// with the key node's version read checked, so a later lease (another
// acquisition writes the key node) is never marked. The mark takes the
// node off its renewal node with its own TTL from the mark's write: the
// lease's end on the ensemble's clock moves no earlier (its last renewal was
// before that write), and renewals of the holder's other leases no longer
// move it. A node whose data this package did not write is left alone.
func (l *Locker) preemptOps(p *keyPlan, hash string) []any {
	var ops []any
	for _, h := range p.liveLeases() {
		if h.data.Owner == hash || h.data.Owner == "?" || h.data.Preempted {
			continue
		}
		if len(ops) == 0 {
			ops = append(ops, &zk.CheckVersionRequest{Path: l.keyPath(p.view.key), Version: p.view.kstat.Version})
		}
		d := h.data
		d.Preempted = true
		if ttl := h.ttlMs(); ttl > 0 {
			d.Session, d.TTLMs = "", ttl
		}
		ops = append(ops, &zk.SetDataRequest{Path: l.nodePath(p.view.key, h.name), Data: mustJSON(d), Version: h.stat.Version})
	}
	return ops
}

// preemptedError is a renewal's answer for a lease a request with Preempt
// stopped on key.
func preemptedError(op string, lease *lock.Lease, key string) error {
	return fmt.Errorf("%s: %w: a newer request waits for key %q and stopped this lease; it stays valid until %s, release it once the work has stopped",
		op, lock.ErrPreempted, key, lease.Expires.Format(time.RFC3339Nano))
}
