package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestKillRestartKeepsData: a committed row survives SIGKILL of the whole
// server and crash recovery, and the role has only the documented grants.
func TestKillRestartKeepsData(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := s.Conn(t)
	if _, err := c.Exec(ctx, "CREATE SCHEMA t; CREATE TABLE t.v (n int); INSERT INTO t.v VALUES (42)"); err != nil {
		t.Fatalf("as %s with CONNECT and CREATE: %v", User, err)
	}
	if _, err := c.Exec(ctx, "CREATE DATABASE other"); err == nil {
		t.Fatalf("%s may create databases: want only CONNECT and CREATE on %s", User, Database)
	}
	s.Kill()
	if s.Running() {
		t.Fatal("running after Kill")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	c2 := s.Conn(t)
	var n int
	if err := c2.QueryRow(ctx, "SELECT n FROM t.v").Scan(&n); err != nil || n != 42 {
		t.Fatalf("after restart: n = %d, %v; want 42", n, err)
	}
}

// TestPauseResume: a paused server does not answer; a resumed one does.
func TestPauseResume(t *testing.T) {
	s := Start(t)
	c := s.Conn(t)
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := c.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a paused server answered")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	if _, err := s.Conn(t).Exec(ctx2, "SELECT 1"); err != nil {
		t.Fatalf("after Resume: %v", err)
	}
}

// TestTLSOnly: WithTLS refuses plain TCP and accepts TLS with the CA.
func TestTLSOnly(t *testing.T) {
	s := Start(t, WithTLS(), WithPassword("s3cret"))
	if s.TLSConfig() == nil {
		t.Fatal("no TLS config")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := s.Conn(t).Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("over TLS: %v", err)
	}
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host, cfg.Port, cfg.User, cfg.Password, cfg.Database = s.Host, uint16(s.Port), s.User, s.Password, s.Database
	cfg.TLSConfig, cfg.Fallbacks = nil, nil
	if c, err := pgx.ConnectConfig(ctx, cfg); err == nil {
		_ = c.Close(ctx)
		t.Fatal("a plain TCP connection was accepted by a TLS-only server")
	}
}

// TestServerSetting: WithServerSetting reaches the server, and stays across
// Kill and Restart.
func TestServerSetting(t *testing.T) {
	s := Start(t, WithServerSetting("wal_writer_delay", "10s"), WithServerSetting("fsync", "on"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	check := func(when string) {
		t.Helper()
		var delay, fsync string
		if err := s.Conn(t).QueryRow(ctx, "SELECT current_setting('wal_writer_delay'), current_setting('fsync')").Scan(&delay, &fsync); err != nil {
			t.Fatal(err)
		}
		if delay != "10s" || fsync != "on" {
			t.Fatalf("%s: wal_writer_delay = %q, fsync = %q; want 10s and on (the harness's fsync=off overridden)", when, delay, fsync)
		}
	}
	check("after Start")
	s.Kill()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	check("after Restart")
}
