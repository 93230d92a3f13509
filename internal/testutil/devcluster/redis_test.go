package devcluster

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestExternalRedisIsUsedNotStarted: a cluster given another cluster's Redis
// needs no redis-server of its own, records the address it was given (for
// its dev-redis backend and StartStore), and neither kills nor restarts it.
func TestExternalRedisIsUsedNotStarted(t *testing.T) {
	srv := redistest.Start(t)
	manager := filepath.Join(t.TempDir(), "lockwarden")
	if err := os.WriteFile(manager, []byte("#!/bin/sh\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LOCKWARDEN_REDIS_SERVER", "")
	t.Setenv("PATH", t.TempDir()) // no redis-server to find
	opts := Options{Root: t.TempDir(), Dir: t.TempDir(), Assets: t.TempDir(), Manager: manager, ExternalRedis: []string{srv.Addr}}
	if err := opts.defaults(); err != nil {
		t.Fatalf("defaults with ExternalRedis and no redis-server: %v", err)
	}
	if opts.ClusterName != ClusterName || opts.Store != StoreRedis {
		t.Errorf("defaults: ClusterName %q, Store %q; want %q, %q", opts.ClusterName, opts.Store, ClusterName, StoreRedis)
	}
	c := &Cluster{opts: opts, logDir: t.TempDir()}
	if err := c.startRedis(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := c.RedisAddrs(); len(got) != 1 || got[0] != srv.Addr {
		t.Fatalf("RedisAddrs = %v, want [%s]", got, srv.Addr)
	}
	s, err := c.StartStore(t.Context(), StoreRedis)
	if err != nil || len(s.Addrs) != 1 || s.Addrs[0] != srv.Addr {
		t.Fatalf("StartStore(redis) = %v, %v; want the external address %s", s, err, srv.Addr)
	}
	c.KillRedis(0)
	if err := c.StartRedis(t.Context(), 0); err == nil {
		t.Error("StartRedis on an external master succeeded; the cluster does not own it")
	}
	c.Stop()
	if err := srv.Client().Ping(t.Context()).Err(); err != nil {
		t.Errorf("the external Redis stopped answering after KillRedis and Stop: %v", err)
	}
}
