package etcd

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// inspectChunk is how many keys one read transaction covers: four reads a
// key stay within etcd's default limit of 128 operations a transaction.
const inspectChunk = 32

// Inspect reports what etcd holds for each key, in order (see lock.Locker):
// the holder and its fencing token (the fence record's ModRevision: the
// last token issued, also when the key is free), Acquired as the acquiring client's clock
// recorded it (etcd has no clock to offer), Expires from the etcd lease's
// remaining TTL (of the session it is on), the lease as the one entry of
// Holders or, for a semaphore, its slots oldest token first with the
// weight each takes (1 for a mutex lease, and for a slot of an earlier
// version, which records none; at most lock.MaxInspectHolders,
// HolderCount all of them), the oldest waiters (at most lock.MaxInspectWaiters)
// with the time they joined, on the joining client's clock, and the exact
// number of waiters (Queued). A waiter key lives as long as its waiter's
// etcd lease, so every waiter key is a live waiter, as acquisitions count
// them; the queue range read for the listing counts them all, in the same
// transaction.
func (l *Locker) Inspect(ctx context.Context, keys []string) ([]lock.KeyState, error) {
	if len(keys) == 0 {
		return nil, &lock.InvalidRequestError{Field: "keys", Reason: "at least one key is required"}
	}
	if err := lock.ValidateKeys(keys); err != nil {
		return nil, err
	}
	op := fmt.Sprintf("inspect keys %q", keys)
	if err := l.connect(); err != nil {
		return nil, l.unavailable(op, err)
	}
	out := make([]lock.KeyState, 0, len(keys))
	ttls := map[int64]time.Time{}
	for lo := 0; lo < len(keys); lo += inspectChunk {
		chunk := keys[lo:min(lo+inspectChunk, len(keys))]
		var gets []clientv3.Op
		for _, k := range chunk {
			gets = append(gets,
				clientv3.OpGet(l.holderKey(k)),
				clientv3.OpGet(l.fenceKey(k), clientv3.WithKeysOnly()),
				// In the queue's order: ranked waiters by their values,
				// then those of earlier versions (by owner tag here).
				clientv3.OpGet(l.queuePrefix(k), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByValue, clientv3.SortAscend), clientv3.WithLimit(lock.MaxInspectWaiters)),
				clientv3.OpGet(l.slotPrefix(k), clientv3.WithPrefix()))
		}
		tctx, cancel := l.opCtx(ctx)
		resp, err := l.etcd().Txn(tctx).Then(gets...).Commit()
		cancel()
		if err != nil {
			return nil, l.unavailable(op, err)
		}
		if len(resp.Responses) != 4*len(chunk) {
			return nil, l.unavailable(op, fmt.Errorf("unexpected transaction reply: %d results for %d keys", len(resp.Responses), len(chunk)))
		}
		for i, k := range chunk {
			st := lock.KeyState{Key: k}
			rs := resp.Responses[4*i : 4*i+4]
			if kvs := rs[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
				var rec holderRecord
				if _, err := decodeValue(kvs[0].Value, &rec); err != nil {
					return nil, l.unavailable(op, fmt.Errorf("holder of key %q: %w", k, err))
				}
				// The token is the fence record's ModRevision (the last
				// acquisition's, a re-acquisition by the same owner
				// included); the holder key's CreateRevision only when
				// the record is missing (it never is: every acquisition
				// writes it).
				st.Held, st.Holder, st.Fence, st.HolderCount = true, rec.Holder, kvs[0].CreateRevision, 1
				if fk := rs[1].GetResponseRange().GetKvs(); len(fk) > 0 {
					st.Fence = fk[0].ModRevision
				}
				if rec.Acquired > 0 {
					st.Acquired = time.UnixMilli(rec.Acquired)
				}
				if st.Expires, err = l.expiryOf(ctx, kvs[0].Lease, ttls); err != nil {
					return nil, l.unavailable(op, err)
				}
				st.Holders = []lock.HolderState{{Holder: st.Holder, Fence: st.Fence, Acquired: st.Acquired, Expires: st.Expires, Weight: 1}}
			} else if kvs := rs[1].GetResponseRange().GetKvs(); len(kvs) > 0 {
				st.Fence = kvs[0].ModRevision
			}
			slots, err := parseSlots(rs[3].GetResponseRange().GetKvs())
			if err != nil {
				return nil, l.unavailable(op, fmt.Errorf("semaphore slot of key %q: %w", k, err))
			}
			for j, sl := range slots {
				st.HolderCount++
				if len(st.Holders) >= lock.MaxInspectHolders {
					continue
				}
				h := lock.HolderState{Holder: sl.rec.Holder, Fence: sl.token, Weight: sl.rec.slots()}
				if sl.rec.Acquired > 0 {
					h.Acquired = time.UnixMilli(sl.rec.Acquired)
				}
				if h.Expires, err = l.expiryOf(ctx, int64(sl.lease), ttls); err != nil {
					return nil, l.unavailable(op, err)
				}
				st.Holders = append(st.Holders, h)
				if j == 0 && !st.Held {
					st.Held, st.Holder, st.Fence, st.Acquired, st.Expires = true, h.Holder, h.Fence, h.Acquired, h.Expires
				}
			}
			// A range response's Count is the number of keys in the whole
			// range, whatever its limit.
			queue := rs[2].GetResponseRange()
			st.Queued = int(queue.GetCount())
			for _, kv := range queue.GetKvs() {
				var rec waiterRecord
				if _, _, err := decodeWaiter(kv.Value, &rec); err != nil {
					return nil, l.unavailable(op, fmt.Errorf("waiter of key %q: %w", k, err))
				}
				w := lock.Waiter{Holder: rec.Holder}
				if rec.Since > 0 {
					w.Since = time.UnixMilli(rec.Since)
				}
				st.Waiters = append(st.Waiters, w)
			}
			out = append(out, st)
		}
	}
	return out, nil
}

// expiryOf is when the etcd lease id ends (zero for none), asked once per
// lease and Inspect call (ttls).
func (l *Locker) expiryOf(ctx context.Context, id int64, ttls map[int64]time.Time) (time.Time, error) {
	if id == 0 {
		return time.Time{}, nil
	}
	if exp, ok := ttls[id]; ok {
		return exp, nil
	}
	exp, err := l.leaseExpiry(ctx, clientv3.LeaseID(id))
	if err != nil {
		return time.Time{}, err
	}
	ttls[id] = exp
	return exp, nil
}

// leaseExpiry asks etcd how long the lease has left.
func (l *Locker) leaseExpiry(ctx context.Context, id clientv3.LeaseID) (time.Time, error) {
	tctx, cancel := l.opCtx(ctx)
	defer cancel()
	now := l.opts.Now()
	r, err := l.etcd().TimeToLive(tctx, id)
	if err != nil {
		return time.Time{}, fmt.Errorf("lease time to live: %w", err)
	}
	// -1: expired, its keys are about to be deleted.
	return now.Add(time.Duration(max(r.TTL, 0)) * time.Second), nil
}
