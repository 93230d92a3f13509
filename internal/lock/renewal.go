package lock

import (
	"context"
	"fmt"
	"time"
)

// RenewBatch renews the leases at the indexes valid (each already checked by
// the store's validation) and sets out[i] and errs[i] for each of them, with
// the meanings of Locker.RenewAll.
type RenewBatch func(ctx context.Context, leases []*Lease, valid []int, ttl time.Duration, out []*Lease, errs []error)

// Renewals gives a store's Locker its Renew and RenewAll (embed it) from the
// store's batch renewal: a store writes how it renews many leases at once,
// and Renew is a batch of one.
type Renewals struct {
	// Validate checks a lease and TTL before anything is sent.
	Validate func(*Lease, time.Duration) error
	// Batch renews validated leases.
	Batch RenewBatch
}

// Renew renews one lease (see Locker): the lease is checked with Validate,
// whose error is returned as it is, then renewed as a batch of one.
func (r Renewals) Renew(ctx context.Context, lease *Lease, ttl time.Duration) (*Lease, error) {
	if err := r.Validate(lease, ttl); err != nil {
		return nil, err
	}
	out, errs := make([]*Lease, 1), make([]error, 1)
	r.Batch(ctx, []*Lease{lease}, []int{0}, ttl, out, errs)
	return out[0], errs[0]
}

// RenewAll renews many leases (see Locker): every lease is checked with
// Validate first (one that fails gets the error, named by its index, and is
// not sent), then Batch runs once over the others. Results and errors are by
// index.
func (r Renewals) RenewAll(ctx context.Context, leases []*Lease, ttl time.Duration) ([]*Lease, []error) {
	out := make([]*Lease, len(leases))
	errs := make([]error, len(leases))
	var valid []int
	for i, le := range leases {
		if err := r.Validate(le, ttl); err != nil {
			errs[i] = fmt.Errorf("leases[%d]: %w", i, err)
			continue
		}
		valid = append(valid, i)
	}
	if len(valid) > 0 {
		r.Batch(ctx, leases, valid, ttl, out, errs)
	}
	return out, errs
}
