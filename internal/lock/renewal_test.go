package lock

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRenewAllValidSendsOnlyValidLeases: a lease that fails validation gets
// its error, named by index, and the store's renewal sees only the others.
func TestRenewAllValidSendsOnlyValidLeases(t *testing.T) {
	bad := errors.New("no owner")
	validate := func(l *Lease, _ time.Duration) error {
		if l.Owner == "" {
			return bad
		}
		return nil
	}
	leases := []*Lease{{Owner: "a"}, {}, {Owner: "c"}}
	var sent []int
	out, errs := RenewAllValid(leases, time.Second, validate, func(valid []int, out []*Lease, errs []error) {
		sent = valid
		for _, i := range valid {
			out[i] = leases[i]
		}
	})
	if !slices.Equal(sent, []int{0, 2}) {
		t.Fatalf("renewed indexes %v, want [0 2]", sent)
	}
	if out[0] != leases[0] || out[1] != nil || out[2] != leases[2] || errs[0] != nil || errs[2] != nil {
		t.Fatalf("results %v, errors %v", out, errs)
	}
	if !errors.Is(errs[1], bad) || !strings.HasPrefix(errs[1].Error(), "leases[1]: ") {
		t.Fatalf("error of the invalid lease: %v; want it named leases[1]", errs[1])
	}
	called := false
	if _, errs := RenewAllValid([]*Lease{{}}, time.Second, validate, func([]int, []*Lease, []error) { called = true }); called || errs[0] == nil {
		t.Fatalf("renewal called with no valid lease (%v), errors %v", called, errs)
	}
	if _, err := RenewOne(&Lease{}, time.Second, validate, func([]int, []*Lease, []error) { called = true }); !errors.Is(err, bad) || err.Error() != bad.Error() || called {
		t.Fatalf("RenewOne of an invalid lease: %v (renewal called: %v); want the validation error itself", err, called)
	}
}
