package postgres

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

func TestConformance(t *testing.T) {
	s := pgtest.Start(t)
	locktest.Run(t, lockerFactory(configFor(s)), locktest.WithWaiterTTL(time.Second))
}

// TestConformancePasswordTLS: a TLS-only server, a non-default password and
// schema, fewer rounds of the race.
func TestConformancePasswordTLS(t *testing.T) {
	s := pgtest.Start(t, pgtest.WithTLS(), pgtest.WithPassword("s3cret'\"x"))
	cfg := configFor(s)
	cfg.Schema = "locks_tls"
	locktest.Run(t, lockerFactory(cfg), locktest.WithWaiterTTL(time.Second), locktest.WithRounds(3))
}
