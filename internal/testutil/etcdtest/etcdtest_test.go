package etcdtest

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/util/wait"
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

// TestNetnsIsolatePeers cuts the leader of a cluster in network namespaces
// off from its peers: the others elect a new leader and serve writes, the old
// one still answers its clients but no longer leads, and after the heal the
// cluster agrees on one leader again. Pause proves that the process tracked is
// etcd itself (not the ip command that started it).
func TestNetnsIsolatePeers(t *testing.T) {
	RequireNetns(t)
	c := StartCluster(t, 3, WithNetns())
	for _, m := range c.Members {
		if strings.HasPrefix(m.Addr, "127.") {
			t.Fatalf("member %s listens on %s, want a bridge address", m.Name, m.Addr)
		}
	}
	put(t, c, "before", "1")
	old, err := c.Leader()
	if err != nil {
		t.Fatal(err)
	}
	heal, err := c.IsolatePeers(old)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = heal() }()
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		isLeader, err := old.IsLeader()
		if err != nil || isLeader {
			return false, nil
		}
		for _, m := range c.Members {
			if m == old {
				continue
			}
			if ok, err := m.IsLeader(); err == nil && ok {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no new leader among the others while %s is isolated: %v", old.Name, err)
	}
	// The isolated member answers Status (its clients are attached) but
	// cannot serve a linearizable read.
	cli, err := old.client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err = cli.Get(ctx, "before")
	cancel()
	if err == nil {
		t.Fatalf("a linearizable read from the isolated member %s succeeded", old.Name)
	}
	if err := heal(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	put(t, c, "after", "1")
	if err := old.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Status(); err == nil {
		t.Fatalf("the paused member %s answers Status: the tracked process is not etcd", old.Name)
	}
	if err := old.Resume(); err != nil {
		t.Fatal(err)
	}
}
