package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockwarden/lockwarden/internal/lock"
)

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

// notHeldGets read every holder key, then every fence record of keys: what
// heldBy needs, and the Else reads of a transaction guarded by heldCmps.
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

// maxTxnOps is etcd's default bound of the operations of one transaction
// (--max-txn-ops); a renewal reads two keys (holder and fence record) per
// lock key, and lock.MaxKeys keeps one lease's reads well under it.
const maxTxnOps = 128

// renewReaders bounds the read transactions of one RenewAll in flight, and
// renewMovers the transactions that move leases to the session.
const (
	renewReaders = 8
	renewMovers  = 32
)

func renewOp(lease *lock.Lease) string {
	return fmt.Sprintf("renew keys %q (fencing token %d)", lease.Keys, lease.Fence)
}

// renewAll is the batch behind Renew and RenewAll (see lock.Renewals), with
// the meanings of lock.Locker's: a lease needs only its Keys, Owner and
// Fence, so a new Locker renews a lease another one acquired. It makes one
// KeepAliveOnce of the Locker's session for ttl (every lease this Locker
// acquired or renewed with that TTL is attached to it), then one read-only
// transaction per maxTxnOps/2 keys that checks the leases still hold their
// keys with their fencing tokens (else lock.ErrLost). A lease whose keys are
// attached to another etcd lease (acquired by another Locker, for example
// before a restart, or with another TTL) is moved to the session once, in a
// transaction that checks the owner and keeps the fencing token. When etcd
// could not be reached the error matches lock.ErrBackendUnavailable: the
// lease may still be held until its Expires. It renews leases[idx...] (all
// valid), storing results and errors at their indices of out and errs.
func (l *Locker) renewAll(ctx context.Context, leases []*lock.Lease, idx []int, ttl time.Duration, out []*lock.Lease, errs []error) {
	start := l.opts.Now()
	fail := func(err error) {
		for _, i := range idx {
			errs[i] = l.unavailable(renewOp(leases[i]), err)
		}
	}
	if err := l.connect(); err != nil {
		fail(err)
		return
	}
	// The session is confirmed after start: every key attached to it that
	// the reads below find is held until start + ttl at least.
	s, err := l.sessionFor(ctx, ttl, start)
	if err != nil {
		fail(err)
		return
	}
	var (
		wg    sync.WaitGroup
		read  = make(chan struct{}, renewReaders)
		moves = make(chan struct{}, renewMovers)
	)
	for _, batch := range renewBatches(leases, idx) {
		read <- struct{}{}
		wg.Go(func() {
			views, err := l.readHeld(ctx, leases, batch)
			<-read
			for j, i := range batch {
				le := leases[i]
				switch {
				case err != nil:
					errs[i] = l.unavailable(renewOp(le), err)
				case views[j].why != "":
					l.log.Info("Lease lost", "keys", le.Keys, "holder", le.Holder, "fence", le.Fence)
					errs[i] = fmt.Errorf("%s: %w: %s", renewOp(le), lock.ErrLost, views[j].why)
				case views[j].preempted:
					// Not renewed: valid until its Expires, never shortened.
					errs[i] = preemptedErr(le, views[j].preemptedKey)
					if views[j].rec.Session {
						moves <- struct{}{}
						wg.Go(func() {
							defer func() { <-moves }()
							l.detach(ctx, le, views[j])
						})
					}
				case views[j].onlyOn(s.id):
					out[i], errs[i] = l.renewed(le, ttl, s, start)
				default:
					moves <- struct{}{}
					wg.Go(func() {
						defer func() { <-moves }()
						out[i], errs[i] = l.moveToSession(ctx, le, views[j], ttl, s, start)
					})
				}
			}
		})
	}
	wg.Wait()
}

// renewBatches splits idx into runs whose leases need at most maxTxnOps
// reads in all (a lease is never split).
func renewBatches(leases []*lock.Lease, idx []int) [][]int {
	var (
		out  [][]int
		cur  []int
		keys int
	)
	for _, i := range idx {
		n := len(leases[i].Keys)
		if leases[i].Limit <= 1 {
			n *= 2 // a holder key and a fence record per key
		}
		if len(cur) > 0 && keys+n > maxTxnOps {
			out, cur, keys = append(out, cur), nil, 0
		}
		cur, keys = append(cur, i), keys+n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// heldView is what a renewal read of one lease's keys found.
type heldView struct {
	// why is empty when the owner's acquisition with the lease's token
	// still holds every key, else why it does not.
	why string
	// ids are the etcd leases the holder keys are attached to.
	ids []clientv3.LeaseID
	// rec is the first key's holder record.
	rec holderRecord
	// mods are the ModRevisions of the holder keys (or of the slot keys,
	// for a semaphore lease).
	mods []int64
	// preempted: a request with Preempt stopped the holding of the key
	// at index preemptedKey (the first such).
	preempted    bool
	preemptedKey int
}

// addRecord records the holder (or slot) record of the key at index i.
func (v *heldView) addRecord(i int, rec holderRecord) {
	if i == 0 {
		v.rec = rec
	}
	if rec.Preempted && !v.preempted {
		v.preempted, v.preemptedKey = true, i
	}
}

// addLease records the etcd lease of one more key.
func (v *heldView) addLease(id clientv3.LeaseID) {
	if !slices.Contains(v.ids, id) {
		v.ids = append(v.ids, id)
	}
}

// reads are the reads that tell whether lease is held: its holder keys and
// fence records, or for a semaphore lease its slot keys.
func (l *Locker) reads(lease *lock.Lease) []clientv3.Op {
	if lease.Limit > 1 {
		return l.slotGets(lease)
	}
	return l.notHeldGets(lease.Keys)
}

// onlyOn reports whether every key is attached to the etcd lease id.
func (v heldView) onlyOn(id clientv3.LeaseID) bool {
	return len(v.ids) == 1 && v.ids[0] == id
}

// readHeld reads the holder keys and fence records of leases[batch...] in
// one read-only transaction (a linearizable read; nothing is written) and
// tells for each lease whether its acquisition still holds every key.
func (l *Locker) readHeld(ctx context.Context, leases []*lock.Lease, batch []int) ([]heldView, error) {
	var gets []clientv3.Op
	for _, i := range batch {
		gets = append(gets, l.reads(leases[i])...)
	}
	tctx, cancel := l.opCtx(ctx)
	resp, err := l.etcd().Txn(tctx).Then(gets...).Commit()
	cancel()
	if err != nil {
		return nil, err
	}
	if len(resp.Responses) != len(gets) {
		return nil, fmt.Errorf("unexpected transaction reply: %d results for %d reads", len(resp.Responses), len(gets))
	}
	views := make([]heldView, len(batch))
	rs := resp.Responses
	for j, i := range batch {
		le := leases[i]
		n := len(l.reads(le))
		if le.Limit > 1 {
			views[j] = slotsHeldBy(le, ownerTag(le.Owner), rs[:n])
		} else {
			views[j] = l.heldBy(le, ownerTag(le.Owner), rs[:n])
		}
		rs = rs[n:]
	}
	return views, nil
}

// heldBy reads the answers of notHeldGets for lease (every holder key, then
// every fence record).
func (l *Locker) heldBy(lease *lock.Lease, tag string, rs []*etcdserverpb.ResponseOp) heldView {
	var v heldView
	n := len(lease.Keys)
	for i, k := range lease.Keys {
		kvs := rs[i].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			v.why = fmt.Sprintf("key %q is free (released or expired)", k)
			return v
		}
		var rec holderRecord
		t, _ := decodeValue(kvs[0].Value, &rec)
		var fence int64
		if fk := rs[n+i].GetResponseRange().GetKvs(); len(fk) > 0 {
			fence = fk[0].ModRevision
		}
		switch {
		case t != tag:
			v.why = fmt.Sprintf("key %q is held by %q with fencing token %d", k, rec.Holder, fence)
			return v
		case fence != lease.Fence:
			v.why = fmt.Sprintf("key %q is held by a later acquisition of the same owner (%q), with fencing token %d", k, rec.Holder, fence)
			return v
		}
		v.addRecord(i, rec)
		v.mods = append(v.mods, kvs[0].ModRevision)
		v.addLease(clientv3.LeaseID(kvs[0].Lease))
	}
	return v
}

// renewed is the lease renewed at start on the session s.
func (l *Locker) renewed(lease *lock.Lease, ttl time.Duration, s *session, start time.Time) (*lock.Lease, error) {
	expires := s.expires(ttl)
	if start.Before(s.refreshed) {
		expires = start.Add(ttl - drift(ttl))
	}
	if now := l.opts.Now(); !expires.After(now) {
		return nil, l.unavailable(renewOp(lease), fmt.Errorf("the renewal took %v, leaving no validity of the %v TTL (drift allowance %v)", now.Sub(start), ttl, drift(ttl)))
	}
	next := *lease
	next.Keys = slices.Clone(lease.Keys)
	next.TTL = ttl
	next.Expires = expires
	if next.Acquired.IsZero() {
		next.Acquired = start
	}
	if v := l.log.V(4); v.Enabled() {
		v.Info("Renewed lease", "keys", lease.Keys, "fence", lease.Fence, "expires", expires)
	}
	return &next, nil
}

// moveToSession attaches the keys of lease (held by its acquisition, on
// another etcd lease) to the session s, keeping its fencing token, and
// returns it renewed. The move checks that the values it read (v) were not
// written since; when one was, it reads them again: the lease may have been
// lost, or preempted, in between.
func (l *Locker) moveToSession(ctx context.Context, lease *lock.Lease, v heldView, ttl time.Duration, s *session, start time.Time) (*lock.Lease, error) {
	op := renewOp(lease)
	for range maxPasses {
		rec := v.rec
		rec.Holder, rec.Lease, rec.TTLMilli, rec.Session = firstNonEmpty(lease.Holder, rec.Holder), int64(s.id), ttl.Milliseconds(), true
		var (
			rev int64
			err error
		)
		if lease.Limit > 1 {
			rec.Fence = lease.Fence
			rev, err = l.moveSlots(ctx, lease, v.mods, rec, s.id)
		} else {
			rev, err = l.relet(ctx, lease.Keys, ownerTag(lease.Owner), lease.Fence, s.id, rec, false, v.mods)
		}
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			l.forget(s.id)
			return nil, l.unavailable(op, err)
		case err != nil:
			return nil, l.unavailable(op, err)
		case rev != 0:
			return l.renewed(lease, ttl, s, start)
		}
		views, err := l.readHeld(ctx, []*lock.Lease{lease}, []int{0})
		switch {
		case err != nil:
			return nil, l.unavailable(op, err)
		case views[0].why != "":
			return nil, fmt.Errorf("%s: %w: %s", op, lock.ErrLost, views[0].why)
		case views[0].preempted:
			return nil, preemptedErr(lease, views[0].preemptedKey)
		}
		v = views[0]
	}
	return nil, fmt.Errorf("%s: %w: the keys changed under every attempt to move them to the session", op, lock.ErrBackendUnavailable)
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// whyNotHeld explains a failed owner check from the transaction's Else
// reads (notHeldGets).
func (l *Locker) whyNotHeld(lease *lock.Lease, tag string, resp *clientv3.TxnResponse) string {
	if len(resp.Responses) == 2*len(lease.Keys) {
		if v := l.heldBy(lease, tag, resp.Responses); v.why != "" {
			return v.why
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
// the etcd leases of an earlier version, one per acquisition, are revoked
// (no key is attached to them any more); a session is never revoked, since
// other keys are attached to it. With mods (the holder keys' ModRevisions
// when read) it also checks that no holder value was written since, so a
// preemption in between is not written over. It returns the transaction's
// revision (the new token of a re-acquisition), or 0 when the owner no
// longer holds the keys with this fence (or a value changed).
func (l *Locker) relet(ctx context.Context, keys []string, tag string, fence int64, newLease clientv3.LeaseID, rec holderRecord, reacquire bool, mods []int64) (int64, error) {
	value := encodeValue(tag, rec)
	cmps := l.heldCmps(keys, tag, fence)
	for i, m := range mods {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(l.holderKey(keys[i])), "=", m))
	}
	var puts []clientv3.Op
	for _, k := range keys {
		puts = append(puts, clientv3.OpPut(l.holderKey(k), value, clientv3.WithLease(newLease), clientv3.WithPrevKV()))
		if reacquire {
			puts = append(puts, clientv3.OpPut(l.fenceKey(k), ""))
		}
	}
	tctx, cancel := l.opCtx(ctx)
	resp, err := l.etcd().Txn(tctx).If(cmps...).Then(puts...).Commit()
	cancel()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, nil
	}
	var old []*mvccpb.KeyValue
	for _, r := range resp.Responses {
		if p := r.GetResponsePut().GetPrevKv(); p != nil && clientv3.LeaseID(p.Lease) != newLease {
			old = append(old, p)
		}
	}
	l.revokeLater(perAcquisition(old)...)
	return resp.Header.Revision, nil
}

// perAcquisition returns the etcd leases of holder keys (their values before
// a change) that were granted for one acquisition, by an earlier version of
// the Locker: they hold nothing once those keys are gone or moved. Sessions
// (this Locker's or another's) are left alone.
func perAcquisition(kvs []*mvccpb.KeyValue) []clientv3.LeaseID {
	var ids []clientv3.LeaseID
	for _, kv := range kvs {
		var rec holderRecord
		if kv.Lease == 0 || slices.Contains(ids, clientv3.LeaseID(kv.Lease)) {
			continue
		}
		if _, err := decodeValue(kv.Value, &rec); err != nil || rec.Session {
			continue
		}
		ids = append(ids, clientv3.LeaseID(kv.Lease))
	}
	return ids
}

// Release deletes the holder keys (or, for a semaphore lease, the slots)
// when the owner token still holds them with the lease's fencing token
// (see lock.Locker); like Renew it needs only Keys, Owner and Fence. The
// deletion wakes the waiters watching the keys. It returns an error matching
// lock.ErrNotHeld when the owner holds none of the keys. When etcd could not
// be reached the release is tried again in the background until etcd
// answers or the Locker is closed.
func (l *Locker) Release(ctx context.Context, lease *lock.Lease) error {
	if err := validateLease(lease); err != nil {
		return err
	}
	op := fmt.Sprintf("release keys %q (fencing token %d)", lease.Keys, lease.Fence)
	if err := l.connect(); err != nil {
		return l.unavailable(op, err)
	}
	first, second := l.releaseHolder, l.releaseSlotsOf
	if lease.Limit > 1 {
		first, second = second, first
	}
	err := first(ctx, op, lease)
	if errors.Is(err, lock.ErrNotHeld) {
		// The lease may name its limit as the lock says now, not as it was
		// acquired (maxHolders changed in between): the acquisition is the
		// owner with this token, whichever kind of holder it took. Left
		// held, it would stay on the session as long as the Locker lives.
		if err2 := second(ctx, op, lease); !errors.Is(err2, lock.ErrNotHeld) {
			return err2
		}
	}
	return err
}

// releaseSlotsOf releases the semaphore slots of lease (see Release).
func (l *Locker) releaseSlotsOf(ctx context.Context, op string, lease *lock.Lease) error {
	why, err := l.releaseSlots(ctx, lease)
	switch {
	case err != nil:
		l.cleanUpLater(op, func(ctx context.Context) error {
			_, err := l.releaseSlots(ctx, lease)
			return err
		})
		return l.unavailable(op, err)
	case why != "":
		return fmt.Errorf("%s: %w: %s", op, lock.ErrNotHeld, why)
	}
	if v := l.log.V(1); v.Enabled() {
		v.Info("Released semaphore slots", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
	}
	return nil
}

// releaseHolder releases the holder keys of a mutex lease (see Release).
func (l *Locker) releaseHolder(ctx context.Context, op string, lease *lock.Lease) error {
	tag := ownerTag(lease.Owner)
	var dels []clientv3.Op
	for _, k := range lease.Keys {
		dels = append(dels, clientv3.OpDelete(l.holderKey(k), clientv3.WithPrevKV()))
	}
	cmps, gets := l.heldCmps(lease.Keys, tag, lease.Fence), l.notHeldGets(lease.Keys)
	tctx, cancel := l.opCtx(ctx)
	resp, err := l.etcd().Txn(tctx).If(cmps...).Then(dels...).Else(gets...).Commit()
	cancel()
	if err != nil {
		// The keys are on a session this Locker keeps alive: they would
		// stay held as long as it lives. Delete them in the background (the
		// owner check spares any later acquisition).
		l.cleanUpLater(op, func(ctx context.Context) error {
			_, err := l.etcd().Txn(ctx).If(cmps...).Then(dels...).Commit()
			return err
		})
		return l.unavailable(op, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%s: %w: %s", op, lock.ErrNotHeld, l.whyNotHeld(lease, tag, resp))
	}
	var prev []*mvccpb.KeyValue
	for _, r := range resp.Responses {
		prev = append(prev, r.GetResponseDeleteRange().GetPrevKvs()...)
	}
	l.revokeLater(perAcquisition(prev)...)
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
