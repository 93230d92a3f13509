package postgres

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockwarden/lockwarden/internal/lock"
)

const (
	// renewBatchRows bounds the lock rows one renewal statement (one
	// transaction) locks: RenewAll splits a larger batch between leases, so
	// that a transaction holds at most this many rows (a lease has at most
	// lock.MaxKeys, fewer than this), and its reply (two int arrays of at
	// most this many elements, about 1 KiB) stays in the server's 8 KiB
	// output buffer until the transaction has committed. 100 rows take about
	// a millisecond to lock and update, so a batch of thousands of leases
	// costs a round trip per hundred instead of holding thousands of rows.
	renewBatchRows = 100
	// renewInFlight is how many renewal statements of one RenewAll run at
	// once (on as many pooled connections).
	renewInFlight = 2
)

// renewBatches splits the positions 0..len(idx)-1 into runs whose leases have
// at most renewBatchRows keys in all (a lease is never split).
func renewBatches(leases []*lock.Lease, idx []int) [][]int {
	var (
		out  [][]int
		cur  []int
		rows int
	)
	for k, i := range idx {
		n := len(leases[i].Keys)
		if len(cur) > 0 && rows+n > renewBatchRows {
			out = append(out, cur)
			cur, rows = nil, 0
		}
		cur = append(cur, k)
		rows += n
	}
	return append(out, cur)
}

// renewAll renews leases[idx...] (all valid) in batches and returns results
// for idx, in order. The whole is bounded by one operation timeout (at most
// half the TTL), as one statement would be.
// renewAll is the batch behind Renew and RenewAll (see lock.Renewals), with
// the meanings of lock.Locker's. It extends each lease to ttl from now (the
// database's clock) when its owner token still holds every key with a live
// lease, in as few round trips as the batch bounds allow: one call of the
// renew function over arrays per renewBatchRows keys, each in its own
// transaction, at most renewInFlight of them at once, all within one
// operation timeout. A lease may come from another Locker or process: only
// Keys, Owner and Fence are needed. When the owner lost a key, the keys it
// still held are released and the error matches lock.ErrLost: the lease is
// gone and is never taken again behind the caller's back. When the database
// could not be reached the error matches lock.ErrBackendUnavailable: the
// lease may still be held until its Expires, so the caller may try again
// before then. When a request with Preempt stopped the lease (its token is
// at or below a key's preemption mark) the error matches lock.ErrPreempted:
// none of its keys is extended, none released, and the lease stays valid
// until its Expires. Results and errors go to out and errs at the leases'
// indexes.
func (l *Locker) renewAll(ctx context.Context, leases []*lock.Lease, idx []int, ttl time.Duration, out []*lock.Lease, errs []error) {
	octx, cancel := l.opContext(ctx, ttl)
	defer cancel()
	batches := renewBatches(leases, idx)
	if len(batches) == 1 {
		l.renewBatch(octx, leases, idx, batches[0], ttl, out, errs)
		return
	}
	sem := make(chan struct{}, renewInFlight)
	var wg sync.WaitGroup
	for _, b := range batches {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			// Each batch writes only its own leases' entries of out and errs.
			l.renewBatch(octx, leases, idx, b, ttl, out, errs)
		})
	}
	wg.Wait()
}

// renewBatch renews the leases at positions batch of idx in one statement
// and stores their results in out and errs, by lease index (idx[k]).
func (l *Locker) renewBatch(ctx context.Context, leases []*lock.Lease, idx, batch []int, ttl time.Duration, out []*lock.Lease, errs []error) {
	var (
		leaseOf []int32
		keys    [][]byte
		owners  = make([]string, len(batch))
		fences  = make([]int64, len(batch))
	)
	for j, k := range batch {
		lease := leases[idx[k]]
		owners[j] = ownerDigest(lease.Owner)
		fences[j] = lease.Fence
		for _, key := range lease.Keys {
			leaseOf = append(leaseOf, int32(j+1))
			keys = append(keys, []byte(key))
		}
	}
	var start time.Time
	lost := make([]int32, len(batch))
	seen := make([]bool, len(batch))
	err := l.call(ctx, "renew", func(ctx context.Context, c *pgx.Conn) error {
		// The validity runs from when the statement goes out.
		start = l.opts.Now()
		var (
			numbers, results []int32
			syncCommit       string
		)
		if err := c.QueryRow(ctx, l.sql.renew, leaseOf, keys, owners, fences, ttl.Milliseconds()).Scan(&numbers, &results, &syncCommit); err != nil {
			return err
		}
		if len(numbers) != len(results) {
			return fmt.Errorf("renew function: %d lease numbers and %d results", len(numbers), len(results))
		}
		for j, n := range numbers {
			if n < 1 || int(n) > len(batch) {
				return fmt.Errorf("renew function: lease number %d out of range [1, %d]", n, len(batch))
			}
			lost[n-1], seen[n-1] = results[j], true
		}
		return nil
	})
	// As in attempt: valid until start + TTL less the drift allowance.
	expires, validity := l.leaseEnd(start, ttl)
	for j, k := range batch {
		i := idx[k]
		lease := leases[i]
		op := fmt.Sprintf("renew keys %q (fencing token %d)", lease.Keys, lease.Fence)
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("%s: %w", op, err)
		case !seen[j]:
			errs[i] = l.unavailable(op, fmt.Errorf("the renew function returned no result for this lease"))
		case lost[j] > 0:
			l.log.Info("Lease lost", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
			errs[i] = fmt.Errorf("%s: %w: %s is no longer held by this owner (expired, or taken by another owner)", op, lock.ErrLost, keyAt(lease.Keys, lost[j]))
		case lost[j] < 0:
			// Still held, neither extended nor shortened.
			errs[i] = fmt.Errorf("%s: %w: a newer request waits for %s and stopped this lease; it stays valid until %s, release it once the work has stopped",
				op, lock.ErrPreempted, keyAt(lease.Keys, -lost[j]), lease.Expires.Format(time.RFC3339Nano))
		case validity <= 0:
			errs[i] = l.unavailable(op, fmt.Errorf("the renewal took %v, leaving no validity of the %v TTL (drift allowance %v)", l.opts.Since(start), ttl, drift(ttl)))
		default:
			next := *lease
			next.TTL = ttl
			next.Expires = expires
			out[i] = &next
			if v := l.log.V(4); v.Enabled() {
				v.Info("Renewed lease", "keys", lease.Keys, "fence", lease.Fence, "validity", validity.String())
			}
		}
	}
}

// keyAt names the key at 1-based position p of keys, as the renew function
// reports it, or "a key" when p is out of range.
func keyAt(keys []string, p int32) string {
	if p >= 1 && int(p) <= len(keys) {
		return fmt.Sprintf("key %q", keys[p-1])
	}
	return "a key"
}

func validateRenew(lease *lock.Lease, ttl time.Duration) error {
	if err := validateLease(lease); err != nil {
		return err
	}
	return lock.ValidateTTL(ttl)
}
