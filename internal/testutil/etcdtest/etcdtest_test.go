package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func put(t *testing.T, c *Cluster, key, val string) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(), Username: c.Username, Password: c.Password})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, key, val); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func TestStartWithAuth(t *testing.T) {
	m := Start(t, WithRootPassword("s3cret"))
	if ok, err := m.IsLeader(); err != nil || !ok {
		t.Fatalf("single member IsLeader = %v, %v; want true", ok, err)
	}
	put(t, m.Cluster(), "k", "v")
}

// TestClusterLeaderKillRestart kills the leader, waits for a new one, and
// brings the old leader back with its data.
func TestClusterLeaderKillRestart(t *testing.T) {
	c := StartCluster(t, 3)
	put(t, c, "before", "1")
	leader, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	next, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatalf("the killed member %s is still the leader", leader.Name)
	}
	put(t, c, "during", "1")
	if err := leader.Restart(); err != nil {
		t.Fatal(err)
	}
	f := c.Followers()[0]
	if err := f.Pause(); err != nil {
		t.Fatal(err)
	}
	put(t, c, "paused", "1")
	if err := f.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(30 * time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestStartWithTLS(t *testing.T) {
	m := Start(t, WithTLS())
	c := m.Cluster()
	if c.ClientTLS() == nil {
		t.Fatal("ClientTLS() = nil for a TLS cluster")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: c.ClientTLS()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put over TLS: %v", err)
	}
}
