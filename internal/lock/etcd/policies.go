package etcd

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// The queue policies, Request.Replace and Request.Preempt: see the package
// documentation.

// policyPasses is how many passes (read, then write) an attempt of req
// makes at most: with Replace one more, for the policies' transaction.
func policyPasses(req lock.Request) int {
	if req.Replace {
		return maxPasses + 1
	}
	return maxPasses
}

// policyStep is the queue policies' part of an attempt's pass over what it
// read (views): the error when the caller was replaced; else, with Replace
// and unless this is the last pass, it applies the policies and reports
// whether they changed the keys, when the pass should read them again.
func (l *Locker) policyStep(ctx context.Context, op string, req lock.Request, tag string, views []keyView, last bool) (bool, error) {
	if err := replacedIn(op, req, views); err != nil {
		return false, err
	}
	if !req.Replace || last {
		return false, nil
	}
	reread, err := l.applyPolicies(ctx, req, tag, views)
	if err != nil {
		return false, l.unavailable(op, err)
	}
	return reread, nil
}

// replacedIn returns the error of an attempt whose owner a request with
// Replace dropped from the queue of one of its keys, or nil.
func replacedIn(op string, req lock.Request, views []keyView) error {
	for i, v := range views {
		if v.replaced {
			return fmt.Errorf("%s: %w: a newer request took its place in the queue of key %q", op, lock.ErrReplaced, req.Keys[i])
		}
	}
	return nil
}

// preemptedWhileWaited reports whether the owner's holding of a key was
// preempted while others wait for that key: it does not take the keys anew
// then (which would write over the preempted holding with a new one).
func preemptedWhileWaited(views []keyView, tag string) bool {
	for _, v := range views {
		if v.held && v.holder.Preempted && slices.ContainsFunc(v.queue, func(w string) bool { return waiterTag(w) != tag }) {
			return true
		}
	}
	return false
}

// waiterTag is the owner tag a waiter key ends with.
func waiterTag(key string) string { return key[strings.LastIndexByte(key, '/')+1:] }

// policyChange is one compare and its writes in a policy transaction.
type policyChange struct {
	cmp clientv3.Cmp
	ops []clientv3.Op
}

// drop is one older waiter to drop: its waiter key, created at rev, and
// the replacement mark of its owner.
type drop struct {
	waiter string
	rev    int64
	mark   string
	value  string
}

// applyPolicies applies req.Replace and req.Preempt to what an attempt read
// (views): it drops the waiters queued before the caller (everyone when it
// is not queued yet) from its keys' queues and marks their owners
// replaced, and with Preempt marks the holdings of other owners preempted.
// Each change compares the key it writes unchanged since the read. It
// reports whether it changed (or found changed) anything, when the caller
// should read the keys again.
func (l *Locker) applyPolicies(ctx context.Context, req lock.Request, tag string, views []keyView) (bool, error) {
	var mine int64 = math.MaxInt64
	for _, v := range views {
		if v.own != nil {
			mine = min(mine, v.ownRev)
		}
	}
	var (
		drops []drop
		stops []policyChange
	)
	now := l.opts.Now().UnixMilli()
	for i, v := range views {
		k := req.Keys[i]
		for j, w := range v.queue {
			wt := waiterTag(w)
			if wt == tag || v.queueRevs[j] >= mine {
				continue
			}
			drops = append(drops, drop{waiter: w, rev: v.queueRevs[j], mark: l.markKey(k, wt), value: encodeValue(wt, markRecord{By: req.Holder, Since: now})})
		}
		if !req.Preempt {
			continue
		}
		if v.held && v.holderTag != tag && !v.holder.Preempted {
			rec := v.holder
			rec.Preempted = true
			hk := l.holderKey(k)
			stops = append(stops, policyChange{
				cmp: clientv3.Compare(clientv3.ModRevision(hk), "=", v.holderMod),
				ops: []clientv3.Op{clientv3.OpPut(hk, encodeValue(v.holderTag, rec), clientv3.WithIgnoreLease())},
			})
		}
		for _, sl := range v.slots {
			if sl.tag == tag || sl.rec.Preempted {
				continue
			}
			// The token moves into the value: the write changes the
			// slot key's ModRevision.
			rec := sl.rec
			rec.Preempted, rec.Fence = true, sl.token
			sk := l.slotKey(k, sl.tag)
			stops = append(stops, policyChange{
				cmp: clientv3.Compare(clientv3.ModRevision(sk), "=", sl.mod),
				ops: []clientv3.Op{clientv3.OpPut(sk, encodeValue(sl.tag, rec), clientv3.WithIgnoreLease())},
			})
		}
	}
	if len(drops) == 0 && len(stops) == 0 {
		return false, nil
	}
	var (
		markLease clientv3.LeaseID
		changes   []policyChange
	)
	if len(drops) > 0 {
		// The marks outlive the dropped waiters' places: two waiter TTLs.
		gctx, cancel := l.opCtx(ctx)
		g, err := l.etcd().Grant(gctx, ttlSeconds(2*l.opts.WaiterTTL))
		cancel()
		if err != nil {
			return false, fmt.Errorf("grant the replacement marks' lease: %w", err)
		}
		markLease = g.ID
		for _, d := range drops {
			changes = append(changes, policyChange{
				cmp: clientv3.Compare(clientv3.CreateRevision(d.waiter), "=", d.rev),
				ops: []clientv3.Op{clientv3.OpDelete(d.waiter), clientv3.OpPut(d.mark, d.value, clientv3.WithLease(markLease))},
			})
		}
	}
	// A waiter is dropped in the transaction that marks it; the changes
	// go in transactions of at most maxTxnOps writes.
	changes = append(changes, stops...)
	wrote := false
	for len(changes) > 0 {
		var (
			cmps []clientv3.Cmp
			ops  []clientv3.Op
		)
		for len(changes) > 0 && len(ops)+len(changes[0].ops) <= maxTxnOps {
			cmps = append(cmps, changes[0].cmp)
			ops = append(ops, changes[0].ops...)
			changes = changes[1:]
		}
		tctx, cancel := l.opCtx(ctx)
		resp, err := l.etcd().Txn(tctx).If(cmps...).Then(ops...).Commit()
		cancel()
		if err != nil {
			return true, fmt.Errorf("apply the queue policies: %w", err)
		}
		if !resp.Succeeded {
			// Something changed since the read: read again.
			break
		}
		wrote = true
	}
	if markLease != 0 && !wrote {
		l.revokeLater(markLease)
	}
	if v := l.log.V(1); wrote && v.Enabled() {
		v.Info("Applied the queue policies", "keys", req.Keys, "holder", req.Holder, "dropped", len(drops), "preempted", len(stops))
	}
	return true, nil
}

// preemptedErr is the renewal error of a lease whose holding of its key
// with that index a request with Preempt stopped.
func preemptedErr(lease *lock.Lease, key int) error {
	return fmt.Errorf("%s: %w: a newer request waits for key %q and stopped this lease; it stays valid until %s, release it once the work has stopped",
		renewOp(lease), lock.ErrPreempted, lease.Keys[key], lease.Expires.Format(time.RFC3339Nano))
}

// detach moves the keys of a preempted lease off the session they share
// with other leases (whose renewals keep the session alive) to an etcd
// lease of their own, of the lease's whole TTL from now: no Expires ever
// given for the lease is later than that, so it is never shortened, and
// the keys are freed within a TTL even while the Locker renews its other
// leases. The fencing token stays. Nothing is done when the keys are on no
// session (detached already); a failure is only logged (the keys then stay
// with the session until released).
func (l *Locker) detach(ctx context.Context, lease *lock.Lease, v heldView) {
	if !v.rec.Session {
		return
	}
	gctx, cancel := l.opCtx(ctx)
	g, err := l.etcd().Grant(gctx, ttlSeconds(time.Duration(v.rec.TTLMilli)*time.Millisecond))
	cancel()
	if err != nil {
		l.log.V(1).Info("Could not move a preempted lease off its session", "keys", lease.Keys, "fence", lease.Fence, "err", err.Error())
		return
	}
	rec := v.rec
	rec.Lease, rec.Session, rec.Preempted = int64(g.ID), false, true
	var rev int64
	if lease.Limit > 1 {
		rec.Fence = lease.Fence
		rev, err = l.moveSlots(ctx, lease, v.mods, rec, g.ID)
	} else {
		rev, err = l.relet(ctx, lease.Keys, ownerTag(lease.Owner), lease.Fence, g.ID, rec, false, v.mods)
	}
	if err != nil || rev == 0 {
		l.revokeLater(g.ID)
		if err != nil {
			l.log.V(1).Info("Could not move a preempted lease off its session", "keys", lease.Keys, "fence", lease.Fence, "err", err.Error())
		}
	}
}
