package redistest

import "testing"

func TestLeaseValueRoundTrip(t *testing.T) {
	for _, owner := range []string{"0123456789abcdef", "12:with spaces 3 4 ", ""} {
		v := LeaseValue(owner, 42, 1700000000000000, "holder with spaces")
		if got := LeaseOwner(v); got != owner {
			t.Errorf("LeaseOwner(%q) = %q, want %q", v, got, owner)
		}
		if f, ok := LeaseFence(v); !ok || f != 42 {
			t.Errorf("LeaseFence(%q) = %d, %v; want 42, true", v, f, ok)
		}
	}
	if got := LeaseOwner("bare-owner-token"); got != "bare-owner-token" {
		t.Errorf("LeaseOwner of an old-layout value = %q, want the value", got)
	}
	if _, ok := LeaseFence("bare-owner-token"); ok {
		t.Error("LeaseFence of an old-layout value reported a token")
	}
}
