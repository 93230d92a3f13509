package postgres

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// TestFaultsStandbyPromotion runs the fenced-register fault test of
// locktest against a primary with a synchronous hot standby
// (synchronous_standby_names names it; the engine's sessions pin
// synchronous_commit = on): once in each run, while a client holds a lease,
// the primary is killed (SIGKILL), the standby promoted, and the clients'
// one address (a switchable proxy, as a failover service name would be)
// switched to it. Every acknowledged acquisition and renewal was flushed on
// the standby before it was acknowledged, so the promoted standby has every
// lease and fence: exclusion and fencing must hold across the failover.
func TestFaultsStandbyPromotion(t *testing.T) {
	pgtest.Require(t) // the runs start their servers in subtests
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, 3) {
		t.Run("pair", func(t *testing.T) {
			f := failoverFaults(t, true)
			locktest.RunFaults(t, "sync", seed, &tally, f)
		})
	}
	tally.Check(t)
}

// TestFaultsStandbyPromotionAsync is TestFaultsStandbyPromotion with an
// asynchronous standby: a commit is acknowledged before the standby has it,
// so a promotion can lose the last acquisitions and renewals, and with them
// leases and fences already handed out (docs: use synchronous replication).
// The replication link is black-holed before the kill, so the standby lacks
// the last commits: the test fails when no run finds a violation (it is
// the negative control of the synchronous test), and logs what it found.
func TestFaultsStandbyPromotionAsync(t *testing.T) {
	pgtest.Require(t) // the runs start their servers in subtests
	const runs = 3
	violations := 0
	for i := range runs {
		t.Run("pair", func(t *testing.T) {
			f := failoverFaults(t, false)
			if err := locktest.FindViolation(t, 1, f); err != nil {
				violations++
				t.Logf("asynchronous standby promotion, run %d: violation: %v", i, err)
			}
		})
	}
	t.Logf("asynchronous standby promotion: %d of %d runs found a violation of exclusion or fencing", violations, runs)
	// The control of TestFaultsStandbyPromotion: the same failover with
	// the acknowledged writes kept back from the standby must break
	// exclusion or fencing, or that test's pass proves nothing.
	if violations == 0 {
		t.Errorf("none of %d promotions of an asynchronous standby that lacked the last commits broke exclusion or fencing: the failover fault cannot tell a safe setup from an unsafe one", runs)
	}
}

// failoverFaults starts a primary and a standby (synchronous when sync) and
// returns the fault run whose one nemesis, "kill-primary-promote", fails over.
func failoverFaults(t *testing.T, sync bool) locktest.Faults {
	primary := pgtest.Start(t)
	repl := locktest.NewLink(t, primary.Addr)
	standby := pgtest.StartStandby(t, primary, pgtest.ReplicateVia(repl.Addr()))
	if sync {
		if err := primary.SetSynchronousStandbys("*"); err != nil {
			t.Fatal(err)
		}
	}
	proxy := newSwitchProxy(t, primary.Addr)
	cfg := configFor(primary)
	host, port, err := net.SplitHostPort(proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host = host
	if cfg.Port, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	// Create the schema on the primary (replicated) before the run.
	createSchema(t, cfg)
	return locktest.Faults{
		NewLocker: func(t *testing.T) lock.Locker {
			return newTestLocker(t, cfg, WithOperationTimeout(faultOpTimeout))
		},
		Nemeses: []locktest.Nemesis{killPrimaryPromote(t, primary, standby, repl, proxy)},
		TTL:     600 * time.Millisecond,
		// The failover comes 0.4-2s into the run; the clients go on
		// against the promoted standby for the rest of it.
		Duration:       4 * time.Second,
		FaultGap:       1600 * time.Millisecond,
		AcquireTimeout: 3 * time.Second,
	}
}

// killPrimaryPromote is the nemesis "kill-primary-promote": once a lease is
// live on the primary, it black-holes the replication link (repl), waits (at
// most 1.5s) until a lease acquired since then is live on the primary (with
// an asynchronous standby acknowledged to its client and missing on the
// standby; with a synchronous one still waiting for the standby, not
// acknowledged), kills the primary (SIGKILL, every backend), promotes the
// standby and switches the clients' proxy to it; then it waits for the run's
// end (there is no standby left to fail over to).
func killPrimaryPromote(t *testing.T, primary, standby *pgtest.Server, repl *locktest.Link, proxy *switchProxy) locktest.Nemesis {
	live := "SELECT count(*) FROM " + pgx.Identifier{DefaultSchema, "locks"}.Sanitize() + " WHERE owner IS NOT NULL AND expires > clock_timestamp() AND acquired > $1"
	return locktest.Nemesis{Name: "kill-primary-promote", Inject: func(ctx context.Context, _ *rand.Rand) {
		c := adminConn(ctx, t, primary, "kill-primary-promote")
		if c == nil {
			return
		}
		defer func() { _ = c.Close(context.Background()) }()
		// leasesSince waits (at most d) until a lease acquired after since
		// is live on the primary, and returns how many are.
		leasesSince := func(since time.Time, d time.Duration) int {
			var n int
			deadline := time.Now().Add(d)
			for ctx.Err() == nil && time.Now().Before(deadline) {
				qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				err := c.QueryRow(qctx, live, since).Scan(&n)
				cancel()
				if err == nil && n > 0 {
					break
				}
				locktestSleep(ctx, 10*time.Millisecond)
			}
			return n
		}
		held := leasesSince(time.Time{}, 3*time.Second)
		var dropped time.Time
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		heal := repl.Drop()
		err := c.QueryRow(qctx, "SELECT clock_timestamp()").Scan(&dropped)
		cancel()
		if err != nil {
			heal()
			if ctx.Err() == nil {
				t.Errorf("kill-primary-promote: read the primary's clock: %v", err)
			}
			return
		}
		behind := leasesSince(dropped, 1500*time.Millisecond)
		if ctx.Err() != nil {
			heal()
			return
		}
		primary.Kill()
		heal()
		began := time.Now()
		if err := standby.Promote(); err != nil {
			t.Errorf("kill-primary-promote: %v", err)
			return
		}
		proxy.Switch(standby.Addr)
		t.Logf("kill-primary-promote: killed the primary with %d leases live, %d of them acquired after the replication link went black (acknowledged only if replication is asynchronous); promoted the standby in %v",
			max(held, behind), behind, time.Since(began).Round(time.Millisecond))
		<-ctx.Done()
	}}
}

// switchProxy is a TCP proxy whose upstream can be switched: the one
// address the clients dial, as a failover service name (or a virtual IP)
// would be. Switch closes every proxied connection, as a failover does.
type switchProxy struct {
	ln net.Listener
	wg sync.WaitGroup

	mu       sync.Mutex
	upstream string
	conns    map[net.Conn]struct{}
}

func newSwitchProxy(t *testing.T, upstream string) *switchProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &switchProxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		_ = ln.Close()
		p.closeAll()
		p.wg.Wait()
	})
	return p
}

// Addr is the host:port the clients dial.
func (p *switchProxy) Addr() string { return p.ln.Addr().String() }

// Switch sends new connections to upstream and closes the open ones.
func (p *switchProxy) Switch(upstream string) {
	p.mu.Lock()
	p.upstream = upstream
	p.mu.Unlock()
	p.closeAll()
}

func (p *switchProxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
	clear(p.conns)
}

// track registers c, so that Switch and the cleanup close it.
func (p *switchProxy) track(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[c] = struct{}{}
}

func (p *switchProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.pipe(client) })
	}
}

func (p *switchProxy) pipe(client net.Conn) {
	p.mu.Lock()
	upstream := p.upstream
	p.mu.Unlock()
	server, err := net.DialTimeout("tcp", upstream, 2*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	p.track(client)
	p.track(server)
	// A Switch between the dial and the tracking would miss this pair:
	// check that the upstream is still the one dialed.
	p.mu.Lock()
	stale := p.upstream != upstream
	p.mu.Unlock()
	if stale {
		_ = client.Close()
		_ = server.Close()
		return
	}
	var once sync.Once
	done := func() {
		once.Do(func() {
			_ = client.Close()
			_ = server.Close()
			p.mu.Lock()
			delete(p.conns, client)
			delete(p.conns, server)
			p.mu.Unlock()
		})
	}
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(server, client); done() })
	wg.Go(func() { _, _ = io.Copy(client, server); done() })
	wg.Wait()
}
