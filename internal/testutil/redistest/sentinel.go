package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Sentinels is a group of real Sentinel processes (redis-server --sentinel)
// monitoring one master, and the data servers they manage: that master and
// its replicas. Which data server is the master changes with failovers
// (Master, Failover).
type Sentinels struct {
	// MasterName is the name the Sentinels know the master by.
	MasterName string
	// Servers are the Sentinel processes; they can be killed and paused like any Server.
	Servers []*Server
	// Data are the data servers: the master the group was started with,
	// then its replicas. Their roles change with failovers.
	Data []*Server
}

// Addrs returns the Sentinels' host:port addresses.
func (g *Sentinels) Addrs() []string {
	addrs := make([]string, len(g.Servers))
	for i, s := range g.Servers {
		addrs[i] = s.Addr
	}
	return addrs
}

// Sentinel timings of the test groups. down-after and failover-timeout are
// in the configuration (sentinelConfig); the periods are set with SENTINEL
// DEBUG (Redis 7), so that a failover and the reconfiguration of the old
// master take a second or two instead of ten: a Sentinel waits four publish
// periods before it turns a restarted old master into a replica, and asks
// replicas for INFO every info period (10s by default).
var sentinelDebug = []any{
	"info-period", 250,
	"publish-period", 200,
	"ping-period", 250,
	"ask-period", 250,
	// A Sentinel whose timer was late (a loaded test machine) stops acting
	// for the tilt period, 30s by default.
	"tilt-period", 1000,
}

// StartSentinels starts n Sentinels that monitor master under masterName, with
// a quorum of n/2+1, a down-after of one second and a failover timeout of five.
// Unless master already has replicas (WithReplicaOf), one is started first,
// with master's password and persistence, and in sync before the Sentinels
// start: the lock engine waits for a replica to acknowledge every
// acquisition in Sentinel mode, as a real Sentinel deployment has replicas.
// Sentinels.Data lists master and its replicas.
func StartSentinels(t testing.TB, master *Server, n int, masterName string) *Sentinels {
	t.Helper()
	replicas := master.Replicas()
	if len(replicas) == 0 && !master.cfg.tls {
		opts := []Option{WithReplicaOf(master), WithPassword(master.cfg.password)}
		if master.cfg.persistence {
			opts = append(opts, WithPersistence())
		}
		replicas = []*Server{Start(t, opts...)}
	}
	sc := &sentinelConfig{master: master, masterName: masterName, quorum: n/2 + 1}
	servers := StartN(t, n, func(c *config) { c.sentinel = sc })
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for _, s := range servers {
		// Redis 6.2 has no SENTINEL DEBUG: its Sentinels keep the default
		// periods, and a failover takes longer.
		_ = s.adminClient().Do(ctx, append([]any{"SENTINEL", "DEBUG"}, sentinelDebug...)...).Err()
	}
	return &Sentinels{MasterName: masterName, Servers: servers, Data: append([]*Server{master}, replicas...)}
}

// StartSentinelGroup starts a Sentinel group for failover tests: a master
// with persistence (appendfsync always) and the given options, replicas
// replicas of it (at least one), and n Sentinels monitoring it, and returns
// once the group is healthy (WaitHealthy): the Sentinels know each other
// and every replica, and would fail over.
func StartSentinelGroup(t testing.TB, replicas, n int, masterName string, opts ...Option) *Sentinels {
	t.Helper()
	if replicas < 1 {
		t.Fatal("redistest: a Sentinel group for failovers needs a replica")
	}
	opts = append(append([]Option(nil), opts...), WithPersistence())
	master := Start(t, opts...)
	StartN(t, replicas, append(opts, WithReplicaOf(master))...)
	g := StartSentinels(t, master, n, masterName)
	ctx, cancel := context.WithTimeout(context.Background(), healTimeout)
	defer cancel()
	if err := g.WaitHealthy(ctx); err != nil {
		t.Fatalf("redistest: the new Sentinel group: %v", err)
	}
	return g
}

// healTimeout bounds how long a group may take to become healthy.
const healTimeout = 60 * time.Second

// sentinelClient returns a Sentinel client for one of the group's Sentinels.
func (g *Sentinels) sentinelClient(s *Server) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
}

// byAddr returns the data server at addr, or nil.
func (g *Sentinels) byAddr(addr string) *Server {
	for _, s := range g.Data {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// MasterAddr returns the address every Sentinel names as the master (SENTINEL
// get-master-addr-by-name), or an error when one does not answer or they
// disagree.
func (g *Sentinels) MasterAddr(ctx context.Context) (string, error) {
	addr := ""
	for _, s := range g.Servers {
		c := g.sentinelClient(s)
		a, err := c.GetMasterAddrByName(ctx, g.MasterName).Result()
		_ = c.Close()
		if err != nil {
			return "", fmt.Errorf("sentinel %s: %w", s.Addr, err)
		}
		if len(a) != 2 {
			return "", fmt.Errorf("sentinel %s: get-master-addr-by-name answered %v", s.Addr, a)
		}
		got := net.JoinHostPort(a[0], a[1])
		if addr != "" && got != addr {
			return "", fmt.Errorf("the Sentinels disagree on the master: %s and %s", addr, got)
		}
		addr = got
	}
	return addr, nil
}

// Master returns the data server every Sentinel names as the master.
func (g *Sentinels) Master(ctx context.Context) (*Server, error) {
	addr, err := g.MasterAddr(ctx)
	if err != nil {
		return nil, err
	}
	m := g.byAddr(addr)
	if m == nil {
		return nil, fmt.Errorf("the Sentinels name %s, which is none of the group's servers", addr)
	}
	return m, nil
}

// WaitHealthy waits until the group could fail over again: every data
// server runs; every Sentinel names the same one as the master, which is
// a master with every other one as an in-sync replica (INFO replication)
// that acknowledges its writes (AckedBy); and every Sentinel sees that master up, knows every other Sentinel and
// sees every replica up and linked to the master.
func (g *Sentinels) WaitHealthy(ctx context.Context) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		last = g.healthy(ctx)
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("the Sentinel group %s did not become healthy: %w (last: %w)", g.MasterName, err, last)
	}
	return nil
}

func (g *Sentinels) healthy(ctx context.Context) error {
	for _, s := range g.Data {
		if !s.Running() {
			return fmt.Errorf("%s is down", s.Addr)
		}
	}
	m, err := g.Master(ctx)
	if err != nil {
		return err
	}
	r, err := m.Role(ctx)
	if err != nil {
		return fmt.Errorf("master %s: %w", m.Addr, err)
	}
	if r.Role != "master" || r.Replicas != len(g.Data)-1 {
		return fmt.Errorf("master %s: role %s with %d replicas in sync, want master with %d", m.Addr, r.Role, r.Replicas, len(g.Data)-1)
	}
	for _, s := range g.Data {
		if s == m {
			continue
		}
		r, err := s.Role(ctx)
		if err != nil {
			return fmt.Errorf("replica %s: %w", s.Addr, err)
		}
		if r.Role != "slave" || r.Master != m.Addr || !r.LinkUp {
			return fmt.Errorf("replica %s: role %s of %q (link up %v), want an in-sync replica of %s", s.Addr, r.Role, r.Master, r.LinkUp, m.Addr)
		}
	}
	if err := m.AckedBy(ctx, len(g.Data)-1); err != nil {
		return err
	}
	for _, s := range g.Servers {
		if err := g.sentinelSeesHealthy(ctx, s, m); err != nil {
			return fmt.Errorf("sentinel %s: %w", s.Addr, err)
		}
	}
	return nil
}

// sentinelSeesHealthy checks one Sentinel's view of the group (SENTINEL
// MASTER, SENTINEL REPLICAS).
func (g *Sentinels) sentinelSeesHealthy(ctx context.Context, s, m *Server) error {
	c := g.sentinelClient(s)
	defer c.Close()
	info, err := c.Master(ctx, g.MasterName).Result()
	if err != nil {
		return err
	}
	if info["flags"] != "master" {
		return fmt.Errorf("master flags %q", info["flags"])
	}
	if n, _ := strconv.Atoi(info["num-other-sentinels"]); n != len(g.Servers)-1 {
		return fmt.Errorf("knows %s other Sentinels, want %d", info["num-other-sentinels"], len(g.Servers)-1)
	}
	replicas, err := c.Replicas(ctx, g.MasterName).Result()
	if err != nil {
		return err
	}
	up := 0
	for _, r := range replicas {
		addr := net.JoinHostPort(r["ip"], r["port"])
		if g.byAddr(addr) == nil || addr == m.Addr {
			continue
		}
		if r["flags"] != "slave" || r["master-link-status"] != "ok" || net.JoinHostPort(r["master-host"], r["master-port"]) != m.Addr {
			return fmt.Errorf("replica %s: flags %q, link %q, master %s:%s", addr, r["flags"], r["master-link-status"], r["master-host"], r["master-port"])
		}
		up++
	}
	if up != len(g.Data)-1 {
		return fmt.Errorf("sees %d replicas up, want %d", up, len(g.Data)-1)
	}
	return nil
}

// KillMaster kills (SIGKILL) the data server the Sentinels name as the
// master and returns it.
func (g *Sentinels) KillMaster(ctx context.Context) (*Server, error) {
	m, err := g.Master(ctx)
	if err != nil {
		return nil, err
	}
	m.Kill()
	return m, nil
}

// Heal waits until every Sentinel names another master than old (which
// KillMaster killed), restarts old (it comes back as the master it was,
// with its data, and the Sentinels turn it into a replica of the new
// master), and waits until the group is healthy (WaitHealthy).
func (g *Sentinels) Heal(ctx context.Context, old *Server) (*Server, error) {
	var last error
	var m *Server
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		m, last = g.Master(ctx)
		if last == nil && m == old {
			last = fmt.Errorf("the Sentinels still name %s", old.Addr)
		}
		return last == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no failover from %s: %w (last: %w)", old.Addr, err, last)
	}
	if !old.Running() {
		if err := old.restart(); err != nil {
			return m, err
		}
	}
	return m, g.WaitHealthy(ctx)
}

// Failover kills the master, waits until the Sentinels promote a replica,
// restarts the old master and returns the new one once the group is healthy
// again (it can fail over again): KillMaster, then Heal.
func (g *Sentinels) Failover(ctx context.Context) (*Server, error) {
	old, err := g.KillMaster(ctx)
	if err != nil {
		return nil, err
	}
	return g.Heal(ctx, old)
}

// Replicas returns the data servers that are not the master the Sentinels name.
func (g *Sentinels) Replicas(ctx context.Context) ([]*Server, error) {
	m, err := g.Master(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Server
	for _, s := range g.Data {
		if s != m {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("the group has no replica")
	}
	return out, nil
}

// sentinelLines is the configuration of a Sentinel monitoring sc.master.
func sentinelLines(sc *sentinelConfig) []string {
	host, mport, _ := net.SplitHostPort(sc.master.Addr)
	lines := []string{
		fmt.Sprintf("sentinel monitor %s %s %s %d", sc.masterName, host, mport, sc.quorum),
		fmt.Sprintf("sentinel down-after-milliseconds %s 1000", sc.masterName),
		fmt.Sprintf("sentinel failover-timeout %s 5000", sc.masterName),
		fmt.Sprintf("sentinel parallel-syncs %s 1", sc.masterName),
	}
	if sc.master.Password != "" {
		lines = append(lines, fmt.Sprintf("sentinel auth-pass %s %s", sc.masterName, sc.master.Password))
	}
	return lines
}
