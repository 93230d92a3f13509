package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Renew extends the lease to ttl from now (the database's clock) when its
// owner token still holds every key with a live lease (see lock.Locker). The
// lease may come from another Locker or process: only Keys and Owner are
// needed. When the owner lost a key, the keys it still held are released and
// the error matches lock.ErrLost: the lease is gone and is never taken again
// behind the caller's back. When the database could not be reached the error
// matches lock.ErrBackendUnavailable: the lease may still be held until its
// Expires, so the caller may try again before then.
func (l *Locker) Renew(ctx context.Context, lease *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
	if err := validateRenew(lease, ttl); err != nil {
		return nil, err
	}
	out, errs := l.renewAll(ctx, []*lock.Lease{lease}, []int{0}, ttl)
	return out[0], errs[0]
}

// RenewAll renews many leases in one round trip: one call of the renew
// function over arrays, one transaction (see lock.Locker). Results and errors
// are by index, with the meaning of Renew.
func (l *Locker) RenewAll(ctx context.Context, leases []*lock.Lease, ttl time.Duration) ([]*lock.Lease, []error) {
	out := make([]*lock.Lease, len(leases))
	errs := make([]error, len(leases))
	var idx []int
	for i, le := range leases {
		if err := validateRenew(le, ttl); err != nil {
			errs[i] = fmt.Errorf("leases[%d]: %w", i, err)
			continue
		}
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		return out, errs
	}
	got, gotErrs := l.renewAll(ctx, leases, idx, ttl)
	for k, i := range idx {
		out[i], errs[i] = got[k], gotErrs[k]
	}
	return out, errs
}

// renewAll renews leases[idx...] (all valid) in one statement and returns
// results for idx, in order.
func (l *Locker) renewAll(ctx context.Context, leases []*lock.Lease, idx []int, ttl time.Duration) ([]*lock.Lease, []error) {
	out := make([]*lock.Lease, len(idx))
	errs := make([]error, len(idx))
	var (
		leaseOf []int32
		keys    [][]byte
		owners  = make([]string, len(idx))
	)
	for k, i := range idx {
		owners[k] = ownerDigest(leases[i].Owner)
		for _, key := range leases[i].Keys {
			leaseOf = append(leaseOf, int32(k+1))
			keys = append(keys, []byte(key))
		}
	}
	var start time.Time
	octx, cancel := l.opContext(ctx, ttl)
	defer cancel()
	lost := make([]int32, len(idx))
	seen := make([]bool, len(idx))
	err := l.call(octx, "renew", func(ctx context.Context, c *pgx.Conn) error {
		// The validity runs from when the statement goes out.
		start = time.Now()
		rows, err := c.Query(ctx, l.sql.renew, leaseOf, keys, owners, ttl.Milliseconds())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var n, pos int32
			if err := rows.Scan(&n, &pos); err != nil {
				return err
			}
			if n < 1 || int(n) > len(idx) {
				return fmt.Errorf("renew function: lease number %d out of range [1, %d]", n, len(idx))
			}
			lost[n-1], seen[n-1] = pos, true
		}
		return rows.Err()
	})
	elapsed := time.Since(start)
	validity := ttl - elapsed - drift(ttl)
	for k, i := range idx {
		lease := leases[i]
		op := fmt.Sprintf("renew keys %q (fencing token %d)", lease.Keys, lease.Fence)
		switch {
		case err != nil:
			errs[k] = fmt.Errorf("%s: %w", op, err)
		case !seen[k]:
			errs[k] = l.unavailable(op, fmt.Errorf("the renew function returned no result for this lease"))
		case lost[k] != 0:
			what := "a key"
			if p := int(lost[k]); p >= 1 && p <= len(lease.Keys) {
				what = fmt.Sprintf("key %q", lease.Keys[p-1])
			}
			l.log.Info("Lease lost", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
			errs[k] = fmt.Errorf("%s: %w: %s is no longer held by this owner (expired, or taken by another owner)", op, lock.ErrLost, what)
		case validity <= 0:
			errs[k] = l.unavailable(op, fmt.Errorf("the renewal took %v, leaving no validity of the %v TTL (drift allowance %v)", elapsed, ttl, drift(ttl)))
		default:
			next := *lease
			next.TTL = ttl
			next.Expires = start.Add(validity)
			out[k] = &next
			if v := l.log.V(4); v.Enabled() {
				v.Info("Renewed lease", "keys", lease.Keys, "fence", lease.Fence, "validity", validity.String())
			}
		}
	}
	return out, errs
}

func validateRenew(lease *lock.Lease, ttl time.Duration) error {
	if err := validateLease(lease); err != nil {
		return err
	}
	if ttl < lock.MinTTL {
		return &lock.InvalidRequestError{Field: "ttl", Reason: fmt.Sprintf("%v is below the minimum of %v", ttl, lock.MinTTL)}
	}
	return nil
}
