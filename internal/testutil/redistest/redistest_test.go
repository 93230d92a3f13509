package redistest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestKillRestartLosesDataWithoutPersistence(t *testing.T) {
	ctx := context.Background()
	s := Start(t)
	c := s.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if s.Running() {
		t.Fatal("server still running after Kill")
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered after Kill")
	}
	s.Restart()
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("after restart without persistence GET k = %v, want redis.Nil", err)
	}
}

func TestPersistenceKeepsDataAcrossRestart(t *testing.T) {
	ctx := context.Background()
	s := Start(t, WithPersistence())
	c := s.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	s.Restart()
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET k = %q, %v; want v", got, err)
	}
}

func TestPasswordAndTLS(t *testing.T) {
	ctx := context.Background()
	s := Start(t, WithPassword("s3cret"), WithTLS())
	if err := s.Client().Ping(ctx).Err(); err != nil {
		t.Fatalf("PING with password over TLS: %v", err)
	}
	plain := redis.NewClient(&redis.Options{Addr: s.Addr, Password: "s3cret", MaxRetries: -1})
	defer plain.Close()
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("plain-text PING to a TLS-only server succeeded")
	}
	wrong := redis.NewClient(&redis.Options{Addr: s.Addr, Password: "wrong", TLSConfig: s.TLSConfig(), MaxRetries: -1})
	defer wrong.Close()
	if err := wrong.Ping(ctx).Err(); err == nil {
		t.Fatal("PING with a wrong password succeeded")
	}
}

func TestPauseResume(t *testing.T) {
	s := Start(t)
	c := s.Client()
	s.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("a paused server answered PING")
	}
	s.Resume()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
}

func TestStartNIndependentMasters(t *testing.T) {
	ctx := context.Background()
	servers := StartN(t, 3)
	seen := map[string]bool{}
	for _, s := range servers {
		if seen[s.Addr] {
			t.Fatalf("two servers on %s", s.Addr)
		}
		seen[s.Addr] = true
		role, err := s.Client().Do(ctx, "ROLE").Slice()
		if err != nil || role[0] != "master" {
			t.Fatalf("ROLE of %s = %v, %v; want master", s.Addr, role, err)
		}
	}
}

func TestSentinelsKnowTheMaster(t *testing.T) {
	ctx := context.Background()
	master := Start(t, WithPassword("pw"))
	g := StartSentinels(t, master, 1, "mymaster")
	sc := redis.NewSentinelClient(&redis.Options{Addr: g.Addrs()[0], MaxRetries: -1})
	defer sc.Close()
	addr, err := sc.GetMasterAddrByName(ctx, "mymaster").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got := addr[0] + ":" + addr[1]; got != master.Addr {
		t.Fatalf("sentinel reports master %s, want %s", got, master.Addr)
	}
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "mymaster", SentinelAddrs: g.Addrs(), Password: "pw"})
	defer fc.Close()
	if err := fc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the failover client: %v", err)
	}
}
