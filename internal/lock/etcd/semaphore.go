package etcd

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Semaphores (Request.Limit > 1). Each holder of key K has a slot key
// "P s/E/T" (T its owner tag) on its Locker's session; the value records
// the Limit it was taken with and its weight, the slots it takes
// (Request.Weight; a value of an earlier version has none and takes one).
// A slot's fencing token is the revision of the transaction that took it
// (the slot key's ModRevision) until a renewal moves it to another session,
// which writes the token into the value. Every acquisition also touches K's
// fence record, so its ModRevision stays the last token issued for K, of
// either kind.
//
// Taking slots is optimistic: an attempt reads every key (holder key, slots,
// queue) at one revision R and decides in Go: no mutex holder, and used +
// ahead + its own weight at most the smallest limit (its own and the
// holders'), where used is the sum of the weights of the other owners'
// slots and ahead that of the waiters queued ahead of it (strict FIFO by
// weight: a heavy waiter at the head is not passed by lighter ones behind
// it; a request without Queue takes slots only while nobody waits). It then
// commits a transaction that puts its slot keys on the condition that no
// holder key appeared and no slot key of the key was created or written
// after R (a range compare of ModRevision): the weights it decided on can
// only have fallen. A queued request also compares its waiter key unchanged
// and, at the head, no waiter ranked ahead of it (see queueCmps), else no
// waiter joined or was written since R (a boosted newcomer may rank ahead
// of it; a waiter's value is written only when it joins, or calls again
// asking for another weight). An owner that
// holds a slot already writes over it, which is a new acquisition with a
// new token.

// semAttempt is one acquisition of semaphore slots (see attempt): value is
// the slot keys' value, s the session, failed what ends an attempt whose
// transaction may have written.
func (l *Locker) semAttempt(ctx context.Context, req lock.Request, tag, value string, s *session, start time.Time, failed func(error) (*lock.Lease, waitHint, error)) (*lock.Lease, waitHint, error) {
	op := fmt.Sprintf("acquire keys %q", req.Keys)
	var reads []clientv3.Op
	for _, k := range req.Keys {
		reads = append(reads, l.keyReads(req, k, tag)...)
	}
	passes := policyPasses(req)
	for pass := range passes {
		tctx, cancel := l.opCtx(ctx)
		resp, err := l.etcd().Txn(tctx).Then(reads...).Commit()
		cancel()
		if err != nil {
			return nil, waitHint{}, l.unavailable(op, err)
		}
		views, err := l.parseViews(req, tag, resp)
		if err != nil {
			return nil, waitHint{}, l.unavailable(op, err)
		}
		reread, err := l.policyStep(ctx, op, req, tag, views, pass == passes-1)
		if err != nil {
			return nil, waitHint{}, err
		}
		if reread {
			continue
		}
		rev := resp.Header.Revision
		if held, hint := l.firstBusy(req, tag, views, rev); held != nil {
			if req.Queue {
				if err := l.enqueue(ctx, req, tag, views, held, &hint); err != nil {
					return nil, waitHint{}, l.unavailable(op, err)
				}
			}
			return nil, hint, held
		}
		var (
			cmps []clientv3.Cmp
			then []clientv3.Op
		)
		for i, k := range req.Keys {
			sp := l.slotPrefix(k)
			cmps = append(cmps,
				clientv3.Compare(clientv3.CreateRevision(l.holderKey(k)), "=", 0),
				clientv3.Compare(clientv3.ModRevision(sp).WithRange(clientv3.GetPrefixRangeEnd(sp)), "<", rev+1))
			switch v := views[i]; {
			case v.own == nil:
				cmps = append(cmps, l.queueCmps(req, k, tag, headCheck{})...)
			case v.pos == 0:
				// At the head: still queued, and nobody ranked ahead of it.
				cmps = append(cmps, l.queueCmps(req, k, tag, headCheck{rev: v.ownRev, bound: v.ownBound})...)
			default:
				// Its turn was decided from the read, with waiters ahead
				// of it: still queued, and no waiter joined or was
				// written since (a boosted newcomer may rank ahead of it,
				// and a waiter ahead that asks for another weight now
				// writes its value again): the weights ahead of it can
				// only have fallen.
				qp := l.queuePrefix(k)
				cmps = append(cmps,
					clientv3.Compare(clientv3.CreateRevision(l.waiterKey(k, tag)), "=", v.ownRev),
					clientv3.Compare(clientv3.ModRevision(qp).WithRange(clientv3.GetPrefixRangeEnd(qp)), "<", rev+1))
			}
			// The owner was not replaced since the read.
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(l.markKey(k, tag)), "=", 0))
			then = append(then,
				clientv3.OpPut(l.slotKey(k, tag), value, clientv3.WithLease(s.id)),
				clientv3.OpPut(l.fenceKey(k), ""))
			if req.Queue {
				then = append(then, clientv3.OpDelete(l.waiterKey(k, tag), clientv3.WithPrevKV()))
			}
		}
		tctx, cancel = l.opCtx(ctx)
		resp, err = l.etcd().Txn(tctx).If(cmps...).Then(then...).Commit()
		cancel()
		if err != nil {
			return failed(err)
		}
		if resp.Succeeded {
			return l.took(req, resp, start, s, failed)
		}
		// Something changed since the read: read again.
	}
	return nil, waitHint{}, fmt.Errorf("%s: %w: the keys changed under %d attempts in a row", op, lock.ErrNotAcquired, maxPasses)
}

// slotGets read the caller's slot key of every key of lease.
func (l *Locker) slotGets(lease *lock.Lease) []clientv3.Op {
	tag := ownerTag(lease.Owner)
	gets := make([]clientv3.Op, 0, len(lease.Keys))
	for _, k := range lease.Keys {
		gets = append(gets, clientv3.OpGet(l.slotKey(k, tag)))
	}
	return gets
}

// slotsHeldBy reads the answers of slotGets for a semaphore lease: whether
// its acquisition still holds a slot of every key.
func slotsHeldBy(lease *lock.Lease, tag string, rs []*etcdserverpb.ResponseOp) heldView {
	var v heldView
	for i, k := range lease.Keys {
		kvs := rs[i].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			v.why = fmt.Sprintf("the owner holds no slot of key %q (released or expired)", k)
			return v
		}
		sl, err := parseSlot(kvs[0])
		switch {
		case err != nil || sl.tag != tag:
			v.why = fmt.Sprintf("the slot of key %q is not this owner's", k)
			return v
		case sl.token != lease.Fence:
			v.why = fmt.Sprintf("the owner's slot of key %q is a later acquisition (%q), with fencing token %d", k, sl.rec.Holder, sl.token)
			return v
		}
		v.addRecord(i, sl.rec)
		v.mods = append(v.mods, sl.mod)
		v.addLease(sl.lease)
	}
	return v
}

// releaseSlots deletes the slots of a semaphore lease when its acquisition
// still holds every one: it reads them, then deletes them on the condition
// that none was written since. It reports why they were not held, or an
// etcd failure.
func (l *Locker) releaseSlots(ctx context.Context, lease *lock.Lease) (why string, err error) {
	tag := ownerTag(lease.Owner)
	gets := l.slotGets(lease)
	for range maxPasses {
		tctx, cancel := l.opCtx(ctx)
		resp, err := l.etcd().Txn(tctx).Then(gets...).Commit()
		cancel()
		if err != nil {
			return "", err
		}
		v := slotsHeldBy(lease, tag, resp.Responses)
		if v.why != "" {
			return v.why, nil
		}
		var (
			cmps []clientv3.Cmp
			dels []clientv3.Op
		)
		for i, k := range lease.Keys {
			sk := l.slotKey(k, tag)
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(sk), "=", v.mods[i]))
			dels = append(dels, clientv3.OpDelete(sk))
		}
		tctx, cancel = l.opCtx(ctx)
		done, err := l.etcd().Txn(tctx).If(cmps...).Then(dels...).Commit()
		cancel()
		if err != nil {
			return "", err
		}
		if done.Succeeded {
			return "", nil
		}
	}
	return "the slots changed under every attempt to release them", nil
}

// moveSlots moves the slots of a semaphore lease to the session id with the
// record rec (which carries the lease's token), on the condition that none
// was written since it was read at mods. It returns the transaction's
// revision, or 0 when a slot changed.
func (l *Locker) moveSlots(ctx context.Context, lease *lock.Lease, mods []int64, rec holderRecord, id clientv3.LeaseID) (int64, error) {
	tag := ownerTag(lease.Owner)
	value := encodeValue(tag, rec)
	var (
		cmps []clientv3.Cmp
		puts []clientv3.Op
	)
	for i, k := range lease.Keys {
		sk := l.slotKey(k, tag)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(sk), "=", mods[i]))
		puts = append(puts, clientv3.OpPut(sk, value, clientv3.WithLease(id)))
	}
	tctx, cancel := l.opCtx(ctx)
	defer cancel()
	resp, err := l.etcd().Txn(tctx).If(cmps...).Then(puts...).Commit()
	if err != nil || !resp.Succeeded {
		return 0, err
	}
	return resp.Header.Revision, nil
}
