package pgtest

import (
	"context"
	"testing"
	"time"
)

// TestStandbyPromote: a standby streams the primary's commits (synchronously
// once the primary names it), is read-only until promoted, and accepts the
// role's writes, with the primary's data, after Promote.
func TestStandbyPromote(t *testing.T) {
	p := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.Conn(t).Exec(ctx, "CREATE SCHEMA t; CREATE TABLE t.v (n int); INSERT INTO t.v VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	s := StartStandby(t, p)
	if err := p.SetSynchronousStandbys("*"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Conn(t).Exec(ctx, "SET synchronous_commit = remote_apply; INSERT INTO t.v VALUES (2)"); err != nil {
		t.Fatal(err)
	}
	c := s.Conn(t)
	var sum int
	if err := c.QueryRow(ctx, "SELECT sum(n) FROM t.v").Scan(&sum); err != nil || sum != 3 {
		t.Fatalf("on the standby after a remote_apply commit: sum = %d, %v; want 3", sum, err)
	}
	if _, err := c.Exec(ctx, "INSERT INTO t.v VALUES (4)"); err == nil {
		t.Fatal("the standby accepted a write before Promote")
	}
	p.Kill()
	if err := s.Promote(); err != nil {
		t.Fatal(err)
	}
	c2 := s.Conn(t)
	if _, err := c2.Exec(ctx, "INSERT INTO t.v VALUES (4)"); err != nil {
		t.Fatalf("write after Promote: %v", err)
	}
	if err := c2.QueryRow(ctx, "SELECT sum(n) FROM t.v").Scan(&sum); err != nil || sum != 7 {
		t.Fatalf("after Promote: sum = %d, %v; want 7", sum, err)
	}
}
