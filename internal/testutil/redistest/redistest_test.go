package redistest

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
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
		assertAnswers(t, s)
		role, err := s.Client().Do(ctx, "ROLE").Slice()
		if err != nil || role[0] != "master" {
			t.Fatalf("ROLE of %s = %v, %v; want master", s.Addr, role, err)
		}
	}
}

// assertAnswers fails the test unless the process answering on s.Addr is
// the one s started.
func assertAnswers(t *testing.T, s *Server) {
	t.Helper()
	got, err := ProcessID(context.Background(), s.Client())
	if err != nil {
		t.Fatalf("INFO server on %s: %v", s.Addr, err)
	}
	if want := s.pid(); got != want {
		t.Fatalf("%s is answered by process %d, want the server's own process %d", s.Addr, got, want)
	}
}

// handOutOnce makes the next port choice return port, as FreePort may when
// another test or process took the port between the choice and the bind.
func handOutOnce(t *testing.T, port int) {
	t.Helper()
	orig := pickPort
	var used atomic.Bool
	pickPort = func() (int, error) {
		if used.CompareAndSwap(false, true) {
			return port, nil
		}
		return orig()
	}
	t.Cleanup(func() { pickPort = orig })
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// TestStartOnPortOfAnotherRedis hands a new server the port another
// redis-server listens on. The new process cannot bind it, but the other one
// answers PING there: the server must move to another port, not pass for the
// other one (which made StartN return two servers on one address).
func TestStartOnPortOfAnotherRedis(t *testing.T) {
	other := Start(t)
	handOutOnce(t, portOf(t, other.Addr))
	s := Start(t)
	if s.Addr == other.Addr {
		t.Fatalf("the new server was reported on %s, where another redis-server listens", s.Addr)
	}
	assertAnswers(t, s)
	assertAnswers(t, other)
}

// TestStartOnPortOfAnotherProgram hands a new server a port held by a
// program that accepts connections and never answers.
func TestStartOnPortOfAnotherProgram(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	handOutOnce(t, portOf(t, l.Addr().String()))
	s := Start(t)
	if s.Addr == l.Addr().String() {
		t.Fatalf("the new server was reported on %s, which another program holds", s.Addr)
	}
	assertAnswers(t, s)
}

// TestRestartOnPortTakenOver restarts a server whose port another
// redis-server took while it was down: the restart must fail, not pass for
// the other server.
func TestRestartOnPortTakenOver(t *testing.T) {
	s := Start(t)
	s.Kill()
	handOutOnce(t, portOf(t, s.Addr))
	intruder := Start(t)
	if intruder.Addr != s.Addr {
		t.Fatalf("intruder started on %s, want %s", intruder.Addr, s.Addr)
	}
	err := s.restart()
	if err == nil || !strings.Contains(err.Error(), "port is taken") {
		t.Fatalf("restart on a port taken over = %v, want an error saying the port is taken", err)
	}
	if s.Running() {
		t.Fatal("the failed restart left its process running")
	}
	assertAnswers(t, intruder)
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

// TestSentinelGroupFailsOverTwice kills the master of a Sentinel group
// twice: each time a replica is promoted with the data, and the old master,
// restarted, comes back as a replica of the new one (the Sentinels rewrote
// its configuration; Restart does not make it a master again).
func TestSentinelGroupFailsOverTwice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := StartSentinelGroup(t, 1, 3, "failover", WithPassword("pw"))
	first, err := g.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if first != g.Data[0] {
		t.Fatalf("the Sentinels name %s, want the first master %s", first.Addr, g.Data[0].Addr)
	}
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: g.MasterName, SentinelAddrs: g.Addrs(), Password: "pw"})
	defer fc.Close()
	prev := first
	for round := range 2 {
		key := "k" + strconv.Itoa(round)
		if err := fc.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if n, err := fc.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
			t.Fatalf("WAIT 1 = %d, %v; want 1", n, err)
		}
		start := time.Now()
		next, err := g.Failover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("failover %d: %s -> %s in %v", round, prev.Addr, next.Addr, time.Since(start))
		if next == prev {
			t.Fatalf("failover %d kept the master %s", round, prev.Addr)
		}
		r, err := prev.Role(ctx)
		if err != nil || r.Role != "slave" || r.Master != next.Addr {
			t.Fatalf("the old master after its restart: %+v, %v; want a replica of %s", r, err, next.Addr)
		}
		if got, err := next.Client().Get(ctx, key).Result(); err != nil || got != "v" {
			t.Fatalf("GET %s on the new master = %q, %v; want v", key, got, err)
		}
		prev = next
	}
}

// TestBlockReplication: the writes a master acknowledges while its replica
// is blocked reach no replica (WAIT counts none) until it is unblocked.
func TestBlockReplication(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	master := Start(t)
	replica := Start(t, WithReplicaOf(master))
	unblock, err := replica.BlockReplication(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := master.Client()
	conn := c.Conn()
	defer conn.Close()
	if err := conn.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Longer than the replica's reconnection cron (a second).
	if n, err := conn.Wait(ctx, 1, 1500*time.Millisecond).Result(); err != nil || n != 0 {
		t.Fatalf("WAIT 1 while blocked = %d, %v; want 0", n, err)
	}
	if err := replica.Client().Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET k on the blocked replica = %v, want redis.Nil", err)
	}
	if err := unblock(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Wait(ctx, 1, 10*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 after unblocking = %d, %v; want 1", n, err)
	}
	if err := replica.waitInSync(ctx, master.Addr); err != nil {
		t.Fatal(err)
	}
}
