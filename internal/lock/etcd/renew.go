package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Renew extends the lease to ttl from now when its owner token still holds
// every key with its fencing token (see lock.Locker); it needs only the
// lease's Keys, Owner and Fence, so a new Locker renews a lease another one
// acquired. When the keys are gone or held by another acquisition the error
// matches lock.ErrLost. When etcd could not be reached the error matches
// lock.ErrBackendUnavailable: the lease may still be held until its Expires,
// so the caller may try again before then.
//
// With the TTL the lease was granted with (in whole seconds) it is one
// transaction (the owner check, reading the etcd lease ID) and one
// KeepAliveOnce; with another TTL the holder keys move to a new etcd lease of
// that TTL (see the package documentation).
func (l *Locker) Renew(ctx context.Context, lease *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
	if err := validateRenew(lease, ttl); err != nil {
		return nil, err
	}
	return l.renew(ctx, lease, ttl)
}

// RenewAll renews many leases concurrently over the client's one connection
// (see lock.Locker). Results and errors are by index, with the meaning of
// Renew. etcd has no batch keepalive that checks owners, so each lease is
// its own transaction and keepalive; they are pipelined on the shared gRPC
// connection rather than sent one after the other.
func (l *Locker) RenewAll(ctx context.Context, leases []*lock.Lease, ttl time.Duration) ([]*lock.Lease, []error) {
	out := make([]*lock.Lease, len(leases))
	errs := make([]error, len(leases))
	// Bounded so that thousands of leases do not open thousands of streams at once.
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i, le := range leases {
		if err := validateRenew(le, ttl); err != nil {
			errs[i] = fmt.Errorf("leases[%d]: %w", i, err)
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = l.renew(ctx, le, ttl)
		})
	}
	wg.Wait()
	return out, errs
}

func validateRenew(lease *lock.Lease, ttl time.Duration) error {
	if err := validateLease(lease); err != nil {
		return err
	}
	return lock.ValidateTTL(ttl)
}

// heldCmps checks that every key is held by the owner's acquisition with
// this fencing token: the holder key exists with the owner's tag (a value
// compare fails on a missing key) and the key's fence record was last
// written with this token. Only acquisitions write fence records, in the
// transaction that puts the holder keys (acquireTxn, and relet of a
// re-acquisition), so the record's ModRevision is the token of the holder
// key's current acquisition, and a lease with an older token does not match.
func (l *Locker) heldCmps(keys []string, tag string, fence int64) []clientv3.Cmp {
	var cmps []clientv3.Cmp
	for _, k := range keys {
		cmps = append(cmps, ownerCmps(l.holderKey(k), tag)...)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(l.fenceKey(k)), "=", fence))
	}
	return cmps
}

// notHeldGets are the Else reads of a transaction guarded by heldCmps, for
// whyNotHeld: every holder key, then every fence record.
func (l *Locker) notHeldGets(keys []string) []clientv3.Op {
	gets := make([]clientv3.Op, 0, 2*len(keys))
	for _, k := range keys {
		gets = append(gets, clientv3.OpGet(l.holderKey(k)))
	}
	for _, k := range keys {
		gets = append(gets, clientv3.OpGet(l.fenceKey(k), clientv3.WithKeysOnly()))
	}
	return gets
}

func (l *Locker) renew(ctx context.Context, lease *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
	start := l.opts.Now()
	op := fmt.Sprintf("renew keys %q (fencing token %d)", lease.Keys, lease.Fence)
	tag := ownerTag(lease.Owner)
	if err := l.connect(); err != nil {
		return nil, l.unavailable(op, err)
	}
	var gets []clientv3.Op
	for _, k := range lease.Keys {
		gets = append(gets, clientv3.OpGet(l.holderKey(k)))
	}
	tctx, cancel := l.opCtx(ctx)
	resp, err := l.etcd().Txn(tctx).If(l.heldCmps(lease.Keys, tag, lease.Fence)...).Then(gets...).Else(l.notHeldGets(lease.Keys)...).Commit()
	cancel()
	if err != nil {
		return nil, l.unavailable(op, err)
	}
	if !resp.Succeeded {
		return nil, l.lost(op, lease, tag, resp)
	}
	var (
		recs []holderRecord
		ids  []clientv3.LeaseID
	)
	for i, r := range resp.Responses {
		kvs := r.GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			return nil, fmt.Errorf("%s: %w: key %q vanished", op, lock.ErrLost, lease.Keys[i])
		}
		var rec holderRecord
		if _, err := decodeValue(kvs[0].Value, &rec); err != nil {
			return nil, l.unavailable(op, err)
		}
		recs = append(recs, rec)
		if id := clientv3.LeaseID(kvs[0].Lease); !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 1 && ttlSeconds(ttl) == ttlSeconds(time.Duration(recs[0].TTLMilli)*time.Millisecond) {
		kctx, cancel := l.opCtx(ctx)
		_, err := l.keepAliveOnce(kctx, ids[0])
		cancel()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return nil, fmt.Errorf("%s: %w: the etcd lease expired", op, lock.ErrLost)
		case err != nil:
			return nil, l.unavailable(op, err)
		}
	} else {
		gctx, cancel := l.opCtx(ctx)
		g, err := l.etcd().Grant(gctx, ttlSeconds(ttl))
		cancel()
		if err != nil {
			return nil, l.unavailable(op, err)
		}
		rec := recs[0]
		rec.Holder, rec.Lease, rec.TTLMilli = firstNonEmpty(lease.Holder, rec.Holder), int64(g.ID), ttl.Milliseconds()
		rev, err := l.relet(ctx, lease.Keys, tag, lease.Fence, g.ID, rec, false)
		ok := rev != 0
		if err != nil || !ok {
			l.revokeLater(g.ID)
		}
		if err != nil {
			return nil, l.unavailable(op, err)
		}
		if !ok {
			return nil, fmt.Errorf("%s: %w: the keys were released or taken while moving them to a lease of the new TTL", op, lock.ErrLost)
		}
	}
	elapsed := l.opts.Since(start)
	validity := ttl - elapsed - drift(ttl)
	if validity <= 0 {
		return nil, l.unavailable(op, fmt.Errorf("the renewal took %v, leaving no validity of the %v TTL (drift allowance %v)", elapsed, ttl, drift(ttl)))
	}
	next := *lease
	next.Keys = slices.Clone(lease.Keys)
	next.TTL = ttl
	next.Expires = start.Add(ttl - drift(ttl)) // as in newLease: the call's time is inside the TTL
	if next.Acquired.IsZero() {
		next.Acquired = start
	}
	if v := l.log.V(4); v.Enabled() {
		v.Info("Renewed lease", "keys", lease.Keys, "fence", lease.Fence, "validity", validity.String())
	}
	return &next, nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// lost explains a failed owner check from the transaction's Else reads
// (notHeldGets).
func (l *Locker) lost(op string, lease *lock.Lease, tag string, resp *clientv3.TxnResponse) error {
	l.log.Info("Lease lost", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
	return fmt.Errorf("%s: %w: %s", op, lock.ErrLost, l.whyNotHeld(lease, tag, resp))
}

func (l *Locker) whyNotHeld(lease *lock.Lease, tag string, resp *clientv3.TxnResponse) string {
	n := len(lease.Keys)
	for i, r := range resp.Responses {
		if i >= n {
			break
		}
		kvs := r.GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			return fmt.Sprintf("key %q is free (released or expired)", lease.Keys[i])
		}
		var rec holderRecord
		t, _ := decodeValue(kvs[0].Value, &rec)
		var fence int64
		if n+i < len(resp.Responses) {
			if fk := resp.Responses[n+i].GetResponseRange().GetKvs(); len(fk) > 0 {
				fence = fk[0].ModRevision
			}
		}
		switch {
		case t != tag:
			return fmt.Sprintf("key %q is held by %q with fencing token %d", lease.Keys[i], rec.Holder, fence)
		case fence != lease.Fence:
			return fmt.Sprintf("key %q is held by a later acquisition of the same owner (%q), with fencing token %d", lease.Keys[i], rec.Holder, fence)
		}
	}
	return "the keys are no longer held by this owner"
}

// relet moves the holder keys of the owner's acquisition with this fence to
// the etcd lease newLease with the record rec, in one transaction that
// checks the owner. A renewal (reacquire false) leaves the fence records
// alone, so the fencing token stays. A re-acquisition by the owner
// (reacquire true) also writes every fence record, so the transaction's
// revision becomes the keys' new token, strictly larger than every earlier
// one, and leases with the old token no longer match heldCmps. On success
// the old etcd leases are revoked (no key is attached to them any more). It
// returns the transaction's revision (the new token of a re-acquisition),
// or 0 when the owner no longer holds the keys with this fence.
func (l *Locker) relet(ctx context.Context, keys []string, tag string, fence int64, newLease clientv3.LeaseID, rec holderRecord, reacquire bool) (int64, error) {
	value := encodeValue(tag, rec)
	var puts []clientv3.Op
	for _, k := range keys {
		puts = append(puts, clientv3.OpPut(l.holderKey(k), value, clientv3.WithLease(newLease), clientv3.WithPrevKV()))
		if reacquire {
			puts = append(puts, clientv3.OpPut(l.fenceKey(k), ""))
		}
	}
	tctx, cancel := l.opCtx(ctx)
	resp, err := l.etcd().Txn(tctx).If(l.heldCmps(keys, tag, fence)...).Then(puts...).Commit()
	cancel()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, nil
	}
	var old []clientv3.LeaseID
	for _, r := range resp.Responses {
		if p := r.GetResponsePut().GetPrevKv(); p != nil && p.Lease != 0 && clientv3.LeaseID(p.Lease) != newLease && !slices.Contains(old, clientv3.LeaseID(p.Lease)) {
			old = append(old, clientv3.LeaseID(p.Lease))
		}
	}
	l.revokeLater(old...)
	return resp.Header.Revision, nil
}

// Release deletes the holder keys when the owner token still holds them with
// the lease's fencing token, in one transaction, and revokes the etcd lease
// (see lock.Locker); like Renew it needs only Keys, Owner and Fence. The
// deletion wakes the waiters watching the keys. It returns an error matching
// lock.ErrNotHeld when the owner holds none of the keys.
func (l *Locker) Release(ctx context.Context, lease *lock.Lease) error {
	if err := validateLease(lease); err != nil {
		return err
	}
	op := fmt.Sprintf("release keys %q (fencing token %d)", lease.Keys, lease.Fence)
	tag := ownerTag(lease.Owner)
	if err := l.connect(); err != nil {
		return l.unavailable(op, err)
	}
	var dels []clientv3.Op
	for _, k := range lease.Keys {
		dels = append(dels, clientv3.OpDelete(l.holderKey(k), clientv3.WithPrevKV()))
	}
	tctx, cancel := l.opCtx(ctx)
	resp, err := l.etcd().Txn(tctx).If(l.heldCmps(lease.Keys, tag, lease.Fence)...).Then(dels...).Else(l.notHeldGets(lease.Keys)...).Commit()
	cancel()
	if err != nil {
		return l.unavailable(op, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%s: %w: %s", op, lock.ErrNotHeld, l.whyNotHeld(lease, tag, resp))
	}
	var ids []clientv3.LeaseID
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseDeleteRange().GetPrevKvs() {
			if kv.Lease != 0 && !slices.Contains(ids, clientv3.LeaseID(kv.Lease)) {
				ids = append(ids, clientv3.LeaseID(kv.Lease))
			}
		}
	}
	l.revokeLater(ids...)
	if v := l.log.V(1); v.Enabled() {
		v.Info("Released lease", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
	}
	return nil
}

// Dequeue removes the owner's waiter keys from the keys' queues and revokes
// their waiter lease (see lock.Locker). Leaving a queue it is not in is not
// an error.
func (l *Locker) Dequeue(ctx context.Context, keys []string, owner string) error {
	if len(keys) == 0 || len(keys) > lock.MaxKeys {
		return &lock.InvalidRequestError{Field: "keys", Reason: fmt.Sprintf("%d keys given, want 1 to %d", len(keys), lock.MaxKeys)}
	}
	if err := lock.ValidateKeys(keys); err != nil {
		return err
	}
	if owner == "" {
		return &lock.InvalidRequestError{Field: "owner", Reason: "the waiter's owner token is required"}
	}
	if err := l.connect(); err != nil {
		return l.unavailable(fmt.Sprintf("dequeue from keys %q", keys), err)
	}
	tag := ownerTag(owner)
	var dels []clientv3.Op
	for _, k := range keys {
		dels = append(dels, clientv3.OpDelete(l.waiterKey(k, tag), clientv3.WithPrevKV()))
	}
	tctx, cancel := l.opCtx(ctx)
	resp, err := l.etcd().Txn(tctx).Then(dels...).Commit()
	cancel()
	if err != nil {
		return l.unavailable(fmt.Sprintf("dequeue from keys %q", keys), err)
	}
	l.revokeLater(waiterLeases(resp)...)
	return nil
}
