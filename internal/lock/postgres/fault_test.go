package postgres

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// faultOpTimeout is the clients' operation timeout in the fault tests: a
// paused or black-holed server must not stall them for seconds. The
// sessions' lock_timeout is half of it (see session.go).
const faultOpTimeout = time.Second

// TestFaultsFencedRegister runs the fenced-register fault test of locktest
// (exclusion and fencing) against one server that the clients reach through
// a proxy (locktest.Link), while the server is killed (SIGKILL, every
// backend at once) and restarted with its data, paused and resumed, the link
// is cut, black-holed or slowed, an administrator terminates the engine's
// backends (the pooled and the listening connections), or an
// administrator's open transaction holds the lock rows FOR UPDATE for up to
// 1.4s. Fences must not go backwards across crash recovery, a lease held
// across a restart is either kept with its token or lost, never granted
// twice, and no engine backend waits on a row lock past the sessions'
// server-side bounds.
func TestFaultsFencedRegister(t *testing.T) {
	s := pgtest.Start(t)
	link := locktest.NewLink(t, s.Addr)
	cfg := linkConfig(t, s, link)
	newLocker := func(t *testing.T) lock.Locker {
		return newTestLocker(t, cfg, WithOperationTimeout(faultOpTimeout))
	}
	// Create the schema before the faults start: the external-row-lock
	// nemesis locks the rows of its table.
	createSchema(t, configFor(s))
	nemeses := serverNemeses(t, s, link)
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, 4) {
		f := serverFaults(newLocker, nemeses, 1)
		f.Policies = true
		locktest.RunFaults(t, "single", seed, &tally, f)
	}
	tally.Check(t)
}

// TestFaultsSemaphore runs the semaphore fault test of locktest (never more
// than Limit slots held at once, tokens strictly increasing across every
// holder) under the same faults as TestFaultsFencedRegister, with 2 and 3
// slots; a third of the requests take 2 or more of them (Faults.Weights),
// so exclusion is checked on the weights held. LOCKWARDEN_FAULT_RUNS and
// LOCKWARDEN_FAULT_DURATION make longer series (docs/benchmarks.md).
func TestFaultsSemaphore(t *testing.T) {
	s := pgtest.Start(t)
	link := locktest.NewLink(t, s.Addr)
	cfg := linkConfig(t, s, link)
	newLocker := func(t *testing.T) lock.Locker {
		return newTestLocker(t, cfg, WithOperationTimeout(faultOpTimeout))
	}
	createSchema(t, configFor(s))
	nemeses := serverNemeses(t, s, link)
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, 2) {
		limit := 2 + int(seed%2)
		f := serverFaults(newLocker, nemeses, limit)
		f.Weights = true
		locktest.RunFaults(t, fmt.Sprintf("limit-%d", limit), seed, &tally, f)
	}
	tally.Check(t)
}

// serverFaults is the fault test of newLocker's Lockers under nemeses, with
// limit slots (1: a mutex).
func serverFaults(newLocker func(t *testing.T) lock.Locker, nemeses []locktest.Nemesis, limit int) locktest.Faults {
	return locktest.Faults{
		NewLocker: newLocker,
		Nemeses:   nemeses,
		// Crash recovery and reconnecting (a SCRAM handshake per
		// connection) take a while on a loaded machine: a longer TTL than
		// the default (calls get half of it) and a longer run, so that
		// clients get leases between the faults.
		TTL:      600 * time.Millisecond,
		Duration: 4 * time.Second,
		// Short gaps and faults: five to seven faults a run, so that
		// every run brings most of the seven nemeses (Seeds adds runs
		// while one never came).
		FaultGap:       300 * time.Millisecond,
		AcquireTimeout: 3 * time.Second,
		Limit:          limit,
	}
}

// serverNemeses kill and restart s, pause it, terminate the engine's
// backends, lock its rows from an administrator's transaction, and cut,
// black-hole or slow link.
func serverNemeses(t *testing.T, s *pgtest.Server, link *locktest.Link) []locktest.Nemesis {
	return append([]locktest.Nemesis{
		locktest.KillRestart(t, func(*rand.Rand) (func(), func() error) {
			return s.Kill, func() error {
				began := time.Now()
				err := s.Restart()
				t.Logf("killed and restarted; crash recovery took %v", time.Since(began).Round(time.Millisecond))
				return err
			}
		}),
		locktest.PauseResume(t, 600*time.Millisecond, func(*rand.Rand) (func() error, func() error) {
			return s.Pause, s.Resume
		}),
		terminateBackends(t, s),
		externalRowLock(t, s),
	}, locktest.LinkNemeses([]*locktest.Link{link}, 600*time.Millisecond)...)
}

// linkConfig is configFor(s) with the host and port of link, which proxies to s.
func linkConfig(t *testing.T, s *pgtest.Server, link *locktest.Link) Config {
	t.Helper()
	cfg := configFor(s)
	host, port, err := net.SplitHostPort(link.Addr())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host = host
	if cfg.Port, err = strconv.Atoi(port); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// adminConn opens an administrator's session on s (the superuser, through
// the private socket, past any link), failing t unless ctx has ended.
func adminConn(ctx context.Context, t *testing.T, s *pgtest.Server, nemesis string) *pgx.Conn {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := s.SuperuserConn(cctx)
	if err != nil {
		if ctx.Err() == nil {
			t.Errorf("%s: connect as the superuser: %v", nemesis, err)
		}
		return nil
	}
	return c
}

// terminateBackends is the nemesis "terminate-backends": an administrator
// terminates (pg_terminate_backend) every backend of the engine's sessions,
// which set application_name=lockwarden: the pooled connections, with any
// transaction under way, and the listening connections of Watch and waiting
// Acquire calls, which lose the notifications sent until they are back.
func terminateBackends(t *testing.T, s *pgtest.Server) locktest.Nemesis {
	var listeners atomic.Int64
	t.Cleanup(func() { t.Logf("terminate-backends: %d listening connections terminated in all", listeners.Load()) })
	return locktest.Nemesis{Name: "terminate-backends", Inject: func(ctx context.Context, _ *rand.Rand) {
		c := adminConn(ctx, t, s, "terminate-backends")
		if c == nil {
			return
		}
		defer func() { _ = c.Close(context.Background()) }()
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var all, listening int64
		err := c.QueryRow(qctx, `
			SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)),
			       count(*) FILTER (WHERE query LIKE 'LISTEN %')
			FROM pg_stat_activity
			WHERE application_name = 'lockwarden' AND usename = $1 AND pid <> pg_backend_pid()`, s.User).Scan(&all, &listening)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("terminate-backends: %v", err)
			}
			return
		}
		listeners.Add(listening)
		t.Logf("terminate-backends: terminated %d backends, %d of them listening", all, listening)
	}}
}

// externalRowLock is the nemesis "external-row-lock": an administrator's
// session begins a transaction, locks every row of the engine's locks table
// (the run's key among them) with SELECT ... FOR UPDATE, holds them for
// 250ms-1.4s, longer than the clients' TTL, and rolls back. The engine's
// calls meanwhile fail (lock_timeout) and their leases may run out; none may
// be granted twice. While it holds the rows, a second session checks that no
// engine backend waits on a lock longer than the sessions' lock_timeout
// (half the operation timeout) plus slack for a loaded machine: the bound
// that keeps a backend whose client gave up from holding the rows it already
// locked.
func externalRowLock(t *testing.T, s *pgtest.Server) locktest.Nemesis {
	lockTimeout := faultOpTimeout / 2
	const slack = 800 * time.Millisecond
	table := pgx.Identifier{DefaultSchema, "locks"}.Sanitize()
	return locktest.Nemesis{Name: "external-row-lock", Inject: func(ctx context.Context, rng *rand.Rand) {
		holder := adminConn(ctx, t, s, "external-row-lock")
		if holder == nil {
			return
		}
		defer func() { _ = holder.Close(context.Background()) }()
		watcher := adminConn(ctx, t, s, "external-row-lock")
		if watcher == nil {
			return
		}
		defer func() { _ = watcher.Close(context.Background()) }()
		fail := func(what string, err error) {
			if ctx.Err() == nil {
				t.Errorf("external-row-lock: %s: %v", what, err)
			}
		}
		qctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// The engine's transactions are short: the administrator gets the
		// rows at once, and would not wait forever if not.
		if _, err := holder.Exec(qctx, "SET lock_timeout = '3s'"); err != nil {
			fail("set lock_timeout", err)
			return
		}
		tx, err := holder.Begin(qctx)
		if err != nil {
			fail("begin", err)
			return
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		var rows int
		if err := tx.QueryRow(qctx, "SELECT count(*) FROM (SELECT key FROM "+table+" FOR UPDATE) AS locked").Scan(&rows); err != nil {
			fail("lock the rows", err)
			return
		}
		hold := time.Duration(250+rng.IntN(1150)) * time.Millisecond
		deadline := time.Now().Add(hold)
		var longest time.Duration
		var waiting int
		for time.Now().Before(deadline) && ctx.Err() == nil {
			var n int
			var secs float64
			err := watcher.QueryRow(qctx, `
				SELECT count(*), coalesce(max(extract(epoch FROM clock_timestamp() - state_change)), 0)::float8
				FROM pg_stat_activity
				WHERE application_name = 'lockwarden' AND wait_event_type = 'Lock' AND state = 'active'`).Scan(&n, &secs)
			if err != nil {
				fail("watch the waiting backends", err)
				return
			}
			w := time.Duration(secs * float64(time.Second))
			longest, waiting = max(longest, w), max(waiting, n)
			if w > lockTimeout+slack {
				t.Errorf("external-row-lock: an engine backend has waited %v on a row lock, past the sessions' lock_timeout of %v (+%v slack): it wedges behind the administrator's transaction", w.Round(time.Millisecond), lockTimeout, slack)
				return
			}
			locktestSleep(ctx, 50*time.Millisecond)
		}
		if err := tx.Rollback(qctx); err != nil {
			fail("rollback", err)
		}
		t.Logf("external-row-lock: held %d rows for %v; up to %d engine backends waited at once, the longest %v", rows, hold, waiting, longest.Round(time.Millisecond))
	}}
}

// locktestSleep waits d or until ctx ends.
func locktestSleep(ctx context.Context, d time.Duration) {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
	case <-tm.C:
	}
}
