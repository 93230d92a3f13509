package memory

import (
	"testing"

	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

// BenchmarkRenewAll is one watchdog round over held leases (see
// locktest.BenchRenewAll): the floor of the engine's own work, with no store
// behind it.
func BenchmarkRenewAll(b *testing.B) {
	l, err := New()
	if err != nil {
		b.Fatal(err)
	}
	locktest.BenchRenewAll(b, l, locktest.BenchLeases(b), "renew")
}
