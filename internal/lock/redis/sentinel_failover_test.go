package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// failoverPassword is the password of the failover tests' Sentinel groups.
const failoverPassword = "f4ilover"

// TestFaultsSentinelFailover runs the fenced-register fault test of
// locktest (exclusion and fencing) against a Sentinel group of a master
// and one replica, both with persistence, while the Sentinels fail over:
//
//   - sentinel-failover: the master is killed (SIGKILL), a Sentinel promotes
//     the replica, the old master is restarted and the Sentinels turn it into
//     a replica of the new one;
//   - sentinel-failover-lagging-replica: the same, but the replica is cut
//     off its master first (redistest's BlockReplication), as a network
//     fault between them would, and the master is killed as soon as it
//     holds a lease the replica does not have (or after 0.3-1.5s): what the
//     master acknowledged meanwhile never reaches the replica that is
//     promoted. On loopback replication is so fast that the plain failover
//     almost never loses a write; this is the failover that does.
//
// The lease TTL (4s) outlasts a failover (about 2s from the kill to the new
// master), so that a lease granted just before the kill is still valid when
// the new master grants the key again.
func TestFaultsSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("fault runs take several seconds")
	}
	g := redistest.StartSentinelGroup(t, 1, 3, "failover", redistest.WithPassword(failoverPassword))
	cfg := Config{Addrs: g.Addrs(), MasterName: g.MasterName, Password: failoverPassword}
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, 3) {
		locktest.RunFaults(t, "sentinel", seed, &tally, locktest.Faults{
			NewLocker:      func(t *testing.T) lock.Locker { return newTestLocker(t, cfg, failoverOptions...) },
			Nemeses:        sentinelNemeses(t, g),
			TTL:            4 * time.Second,
			Duration:       12 * time.Second,
			AcquireTimeout: 2 * time.Second,
			FaultGap:       time.Second,
		})
	}
	tally.Check(t)
}

// failoverOptions are the options of the failover tests' Lockers: the
// replica timeout is the node timeout (a second), as by default. Both
// servers fsync every write (appendfsync always) and a replica acknowledges
// after its fsync: on a loaded test machine that takes a few hundred
// milliseconds now and then.
var failoverOptions = []Option{}

// sentinelNemeses are the failovers of a Sentinel group (see
// TestFaultsSentinelFailover). Each returns once the group is healthy
// again, even when the run ends meanwhile: the next run starts from a group
// that can fail over.
func sentinelNemeses(t *testing.T, g *redistest.Sentinels) []locktest.Nemesis {
	heal := func(ctx context.Context, name string, old *redistest.Server, killed time.Time) {
		m, err := g.Heal(ctx, old)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		t.Logf("%s: %s -> %s, healthy %v after the kill", name, old.Addr, m.Addr, time.Since(killed).Round(time.Millisecond))
	}
	return []locktest.Nemesis{
		{Name: "sentinel-failover", Inject: func(_ context.Context, _ *rand.Rand) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			old, err := g.KillMaster(ctx)
			if err != nil {
				t.Errorf("sentinel-failover: %v", err)
				return
			}
			heal(ctx, "sentinel-failover", old, time.Now())
		}},
		{Name: "sentinel-failover-lagging-replica", Inject: func(_ context.Context, rng *rand.Rand) {
			name := "sentinel-failover-lagging-replica"
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			replicas, err := g.Replicas(ctx)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			var unblocks []func(context.Context) error
			for _, r := range replicas {
				unblock, err := r.BlockReplication(ctx)
				if err != nil {
					t.Errorf("%s: %v", name, err)
				} else {
					unblocks = append(unblocks, unblock)
				}
			}
			master, err := g.Master(ctx)
			if err != nil {
				t.Errorf("%s: %v", name, err)
			} else {
				waitForUnreplicatedLease(ctx, master, replicas, 300*time.Millisecond+time.Duration(rng.Int64N(int64(1200*time.Millisecond))))
			}
			old, err := g.KillMaster(ctx)
			killed := time.Now()
			for _, unblock := range unblocks {
				if err := unblock(ctx); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			}
			if err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			heal(ctx, name, old, killed)
		}},
	}
}

// waitForUnreplicatedLease returns once master holds a lock key (of those
// the fault run uses) with a value that some replica does not have, or
// after longest.
func waitForUnreplicatedLease(ctx context.Context, master *redistest.Server, replicas []*redistest.Server, longest time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, longest)
	defer cancel()
	mc := master.Client()
	rcs := make([]*goredis.Client, len(replicas))
	for i, r := range replicas {
		rcs[i] = r.Client()
	}
	_ = wait.PollUntilContextCancel(ctx, 5*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, b := range faultKeys(ctx, master) {
			v, err := mc.Get(ctx, b+"lock").Result()
			if err != nil {
				continue
			}
			for _, rc := range rcs {
				if rv, _ := rc.Get(ctx, b+"lock").Result(); rv != v {
					return true, nil
				}
			}
		}
		return false, nil
	})
}

// TestReplicaConfigValidation: MinReplicas is a Sentinel-mode setting, and
// the replica timeout must be a usable WAIT timeout.
func TestReplicaConfigValidation(t *testing.T) {
	a := []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}
	cases := map[string]struct {
		cfg  Config
		opts []Option
		want rejection
	}{
		"sentinel default":         {cfg: Config{Addrs: a[:1], MasterName: "m"}, want: rejection{Sentinel: "none"}},
		"sentinel 2 replicas":      {cfg: Config{Addrs: a[:1], MasterName: "m", MinReplicas: 2}, want: rejection{Sentinel: "none"}},
		"sentinel no replicas":     {cfg: Config{Addrs: a[:1], MasterName: "m", MinReplicas: NoReplicas}, want: rejection{Sentinel: "none"}},
		"sentinel below -1":        {cfg: Config{Addrs: a[:1], MasterName: "m", MinReplicas: -2}, want: rejection{"lock.ErrInvalidConfig", "MinReplicas"}},
		"standalone with replicas": {cfg: Config{Addrs: a[:1], MinReplicas: 1}, want: rejection{"lock.ErrInvalidConfig", "MinReplicas"}},
		"redlock with replicas":    {cfg: Config{Addrs: a, MinReplicas: NoReplicas}, want: rejection{"lock.ErrInvalidConfig", "MinReplicas"}},
		"zero replica timeout":     {cfg: Config{Addrs: a[:1], MasterName: "m"}, opts: []Option{WithReplicaTimeout(0)}, want: rejection{"lock.ErrInvalidConfig", "WithReplicaTimeout"}},
		"sub-ms replica timeout":   {cfg: Config{Addrs: a[:1], MasterName: "m"}, opts: []Option{WithReplicaTimeout(time.Microsecond)}, want: rejection{"lock.ErrInvalidConfig", "WithReplicaTimeout"}},
	}
	for name, tc := range cases {
		l, err := New(tc.cfg, tc.opts...)
		if got := rejectionOf(err); got != tc.want {
			t.Errorf("%s: New = %+v (%v), want %+v", name, got, err, tc.want)
		}
		if l != nil {
			_ = l.Close()
		}
	}
	for _, tc := range []struct {
		cfg  Config
		want int
	}{
		{Config{Addrs: a[:1], MasterName: "m"}, DefaultMinReplicas},
		{Config{Addrs: a[:1], MasterName: "m", MinReplicas: 3}, 3},
		{Config{Addrs: a[:1], MasterName: "m", MinReplicas: NoReplicas}, 0},
		{Config{Addrs: a[:1]}, 0},
		{Config{Addrs: a}, 0},
	} {
		l, err := New(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if l.replicas != tc.want {
			t.Errorf("%+v: waits for %d replicas, want %d", tc.cfg, l.replicas, tc.want)
		}
		_ = l.Close()
	}
}

// wantReplicaError fails t unless err is a *ReplicaError with acked of
// needed replicas that matches ErrNotReplicated and lock.ErrBackendUnavailable.
func wantReplicaError(t *testing.T, what string, err error, acked, needed int) {
	t.Helper()
	var re *ReplicaError
	if !errors.As(err, &re) || re.Acked != acked || re.Needed != needed {
		t.Fatalf("%s = %v; want a *ReplicaError with %d of %d replicas", what, err, acked, needed)
	}
	if !errors.Is(err, ErrNotReplicated) || !errors.Is(err, lock.ErrBackendUnavailable) || errors.Is(err, lock.ErrLost) {
		t.Fatalf("%s = %v; want it to match ErrNotReplicated and lock.ErrBackendUnavailable, not lock.ErrLost", what, err)
	}
	if want := fmt.Sprintf("%d of %d required replica(s) acknowledged", acked, needed); !strings.Contains(err.Error(), want) {
		t.Fatalf("%s = %q; want it to say %q", what, err, want)
	}
}

// TestSentinelWaitsForReplicas: in Sentinel mode an acquisition or a
// renewal that no replica acknowledges is not reported: the acquisition is
// released and fails, the renewal fails and the lease keeps its Expires.
func TestSentinelWaitsForReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := redistest.StartSentinelGroup(t, 1, 3, "acks", redistest.WithPassword(failoverPassword))
	cfg := Config{Addrs: g.Addrs(), MasterName: g.MasterName, Password: failoverPassword, Prefix: "acks:"}
	l := newTestLocker(t, cfg)
	// For the calls that cannot be acknowledged: they wait the timeout out.
	quick := newTestLocker(t, cfg, WithReplicaTimeout(100*time.Millisecond))
	master, replica := g.Data[0], g.Data[1]

	held, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"renewed"}, TTL: 10 * time.Second, Holder: "acked"})
	if err != nil {
		t.Fatalf("TryAcquire with the replica in sync: %v", err)
	}
	if v, err := replica.Client().Get(ctx, "acks:{renewed}:lock").Result(); err != nil || redistest.LeaseOwner(v) != held.Owner {
		t.Fatalf("the replica has %q, %v for an acknowledged lease; want it held by %s", v, err, held.Owner)
	}

	unblock, err := replica.BlockReplication(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = quick.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: 10 * time.Second, Holder: "unacked"})
	wantReplicaError(t, "TryAcquire with the replica cut off", err, 0, 1)
	if n, err := master.Client().Exists(ctx, "acks:{k}:lock").Result(); err != nil || n != 0 {
		t.Fatalf("the unacknowledged acquisition left the lock key on the master (EXISTS = %d, %v): it must be released", n, err)
	}
	_, err = quick.TryAcquire(ctx, lock.Request{Keys: []string{"sem"}, TTL: 10 * time.Second, Holder: "unacked", Limit: 2})
	wantReplicaError(t, "semaphore TryAcquire with the replica cut off", err, 0, 1)
	if n, err := master.Client().ZCard(ctx, "acks:{sem}:slots").Result(); err != nil || n != 0 {
		t.Fatalf("the unacknowledged semaphore acquisition left %d slot(s), %v: it must be released", n, err)
	}

	_, err = quick.Renew(ctx, held, 20*time.Second)
	wantReplicaError(t, "Renew with the replica cut off", err, 0, 1)
	_, errs := quick.RenewAll(ctx, []*lock.Lease{held}, 20*time.Second)
	wantReplicaError(t, "RenewAll with the replica cut off", errs[0], 0, 1)

	// Asking for no replica restores the asynchronous behaviour.
	async := newTestLocker(t, Config{Addrs: cfg.Addrs, MasterName: cfg.MasterName, Password: cfg.Password, Prefix: cfg.Prefix, MinReplicas: NoReplicas})
	if lease, err := async.TryAcquire(ctx, lock.Request{Keys: []string{"async"}, TTL: time.Second}); err != nil {
		t.Fatalf("TryAcquire with MinReplicas NoReplicas while the replica is cut off: %v", err)
	} else if err := async.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}

	if err := unblock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	renewed, err := l.Renew(ctx, held, 20*time.Second)
	if err != nil {
		t.Fatalf("Renew with the replica back: %v", err)
	}
	if !renewed.Expires.After(held.Expires) {
		t.Fatalf("the renewal did not extend the lease: %v, was %v", renewed.Expires, held.Expires)
	}
	// More replicas than the group has: never acknowledged.
	two := newTestLocker(t, Config{Addrs: cfg.Addrs, MasterName: cfg.MasterName, Password: cfg.Password, Prefix: cfg.Prefix, MinReplicas: 2})
	_, err = two.TryAcquire(ctx, lock.Request{Keys: []string{"two"}, TTL: 10 * time.Second})
	wantReplicaError(t, "TryAcquire asking for 2 of 1 replicas", err, 1, 2)
	if err := l.Release(ctx, renewed); err != nil {
		t.Fatal(err)
	}
}

// TestSentinelFailoverKeepsLeasesAndFences: a lease the replica acknowledged
// survives the failover (the promoted replica refuses the key to another
// owner), one it did not acknowledge was never reported held, and the
// promoted replica issues larger fencing tokens than every one handed out.
func TestSentinelFailoverKeepsLeasesAndFences(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	g := redistest.StartSentinelGroup(t, 1, 3, "keeps", redistest.WithPassword(failoverPassword))
	cfg := Config{Addrs: g.Addrs(), MasterName: g.MasterName, Password: failoverPassword}
	a := newTestLocker(t, cfg, failoverOptions...)
	b := newTestLocker(t, cfg, failoverOptions...)
	req := func(holder string) lock.Request {
		return lock.Request{Keys: []string{"k"}, TTL: 30 * time.Second, Holder: holder}
	}

	// A plain failover keeps an acknowledged lease.
	first, err := a.TryAcquire(ctx, req("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Failover(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = tryUntilAnswered(ctx, b, req("b"))
	var held *lock.HeldError
	if !errors.As(err, &held) || held.Holder != "a" || held.Fence != first.Fence {
		t.Fatalf("TryAcquire on the promoted replica = %v; want the key held by a with fencing token %d", err, first.Fence)
	}
	if err := a.Release(ctx, first); err != nil {
		t.Fatalf("Release on the promoted replica: %v", err)
	}

	// With the replica cut off, an acquisition is refused rather than lost.
	replicas, err := g.Replicas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	unblock, err := replicas[0].BlockReplication(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.TryAcquire(ctx, req("a"))
	wantReplicaError(t, "TryAcquire before the lagging failover", err, 0, 1)
	old, err := g.KillMaster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := unblock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Heal(ctx, old); err != nil {
		t.Fatal(err)
	}
	second, err := tryUntilAnswered(ctx, b, req("b"))
	if err != nil {
		t.Fatalf("TryAcquire after the lagging failover: %v", err)
	}
	if second.Fence <= first.Fence {
		t.Fatalf("fencing token %d after two failovers, not above %d handed out before them", second.Fence, first.Fence)
	}
	if err := b.Release(ctx, second); err != nil {
		t.Fatal(err)
	}
}

// tryUntilAnswered calls TryAcquire until the backend answers: a grant or
// a refusal, not an unavailable backend (the clients reconnect to the new
// master after a failover).
func tryUntilAnswered(ctx context.Context, l *Locker, req lock.Request) (*lock.Lease, error) {
	var lease *lock.Lease
	var err error
	_ = wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		lease, err = l.TryAcquire(ctx, req)
		return !errors.Is(err, lock.ErrBackendUnavailable), nil
	})
	return lease, err
}
