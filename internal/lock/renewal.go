package lock

import (
	"fmt"
	"time"
)

// RenewFunc renews the leases at the indexes valid (each checked by the
// store's validation) and sets out[i] and errs[i] for each of them.
type RenewFunc func(valid []int, out []*Lease, errs []error)

// RenewAllValid is a store's RenewAll around its batch renewal: every lease
// is checked with validate first (one that fails gets the error, named by
// its index, and is not sent), then renew runs once over the others.
// Results and errors are by index.
func RenewAllValid(leases []*Lease, ttl time.Duration, validate func(*Lease, time.Duration) error, renew RenewFunc) ([]*Lease, []error) {
	out := make([]*Lease, len(leases))
	errs := make([]error, len(leases))
	var valid []int
	for i, le := range leases {
		if err := validate(le, ttl); err != nil {
			errs[i] = fmt.Errorf("leases[%d]: %w", i, err)
			continue
		}
		valid = append(valid, i)
	}
	if len(valid) > 0 {
		renew(valid, out, errs)
	}
	return out, errs
}

// RenewOne is a store's Renew as a batch of one: the lease is checked with
// validate (its error returned as it is), then renewed by renew.
func RenewOne(lease *Lease, ttl time.Duration, validate func(*Lease, time.Duration) error, renew RenewFunc) (*Lease, error) {
	if err := validate(lease, ttl); err != nil {
		return nil, err
	}
	out, errs := make([]*Lease, 1), make([]error, 1)
	renew([]int{0}, out, errs)
	return out[0], errs[0]
}
