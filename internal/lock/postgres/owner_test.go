package postgres

import (
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// TestTablesHoldNoOwnerToken: whoever can read the tables (a read-only
// role, a backup) finds no owner token there, only its digest, so cannot
// renew or release a lease; the holder still can.
func TestTablesHoldNoOwnerToken(t *testing.T) {
	s := pgtest.Start(t)
	l := newTestLocker(t, configFor(s))
	holderOwner, waiterOwner := "holder-token-"+strings.Repeat("a", 20), "waiter-token-"+strings.Repeat("b", 20)
	ctx := t.Context()
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: 10 * time.Second, Owner: holderOwner, Holder: "h"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: 10 * time.Second, Owner: waiterOwner, Holder: "w", Queue: true}); err == nil {
		t.Fatal("the waiter acquired a held key")
	}
	c := s.Conn(t)
	var dump string
	if err := c.QueryRow(ctx, `SELECT coalesce(string_agg(owner, ','), '') FROM (
		SELECT owner FROM lockwarden.locks UNION ALL SELECT owner FROM lockwarden.waiters) o`).Scan(&dump); err != nil {
		t.Fatal(err)
	}
	if dump == "" || strings.Contains(dump, holderOwner) || strings.Contains(dump, waiterOwner) {
		t.Fatalf("owner columns = %q: want digests, not the tokens", dump)
	}
	if _, err := l.Renew(ctx, lease, 10*time.Second); err != nil {
		t.Fatalf("Renew by the holder: %v", err)
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatalf("Release by the holder: %v", err)
	}
}
