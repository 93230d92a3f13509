package lock

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRenewalsSendOnlyValidLeases: a lease that fails validation gets its
// error, named by index, and the store's batch sees only the others.
func TestRenewalsSendOnlyValidLeases(t *testing.T) {
	bad := errors.New("no owner")
	validate := func(l *Lease, _ time.Duration) error {
		if l.Owner == "" {
			return bad
		}
		return nil
	}
	leases := []*Lease{{Owner: "a"}, {}, {Owner: "c"}}
	var sent []int
	r := Renewals{Validate: validate, Batch: func(_ context.Context, leases []*Lease, valid []int, _ time.Duration, out []*Lease, _ []error) {
		sent = valid
		for _, i := range valid {
			out[i] = leases[i]
		}
	}}
	ctx := context.Background()
	out, errs := r.RenewAll(ctx, leases, time.Second)
	if !slices.Equal(sent, []int{0, 2}) {
		t.Fatalf("renewed indexes %v, want [0 2]", sent)
	}
	if out[0] != leases[0] || out[1] != nil || out[2] != leases[2] || errs[0] != nil || errs[2] != nil {
		t.Fatalf("results %v, errors %v", out, errs)
	}
	if !errors.Is(errs[1], bad) || !strings.HasPrefix(errs[1].Error(), "leases[1]: ") {
		t.Fatalf("error of the invalid lease: %v; want it named leases[1]", errs[1])
	}
	sent = nil
	if _, errs := r.RenewAll(ctx, []*Lease{{}}, time.Second); sent != nil || errs[0] == nil {
		t.Fatalf("batch called with no valid lease (%v), errors %v", sent, errs)
	}
	if _, err := r.Renew(ctx, &Lease{}, time.Second); !errors.Is(err, bad) || err.Error() != bad.Error() || sent != nil {
		t.Fatalf("Renew of an invalid lease: %v (batch called with %v); want the validation error itself", err, sent)
	}
	if got, err := r.Renew(ctx, leases[2], time.Second); err != nil || got != leases[2] || !slices.Equal(sent, []int{0}) {
		t.Fatalf("Renew of a valid lease: %v, %v (batch called with %v)", got, err, sent)
	}
}
