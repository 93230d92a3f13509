package controllers

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/metrics"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestHoldingManyLeasesWritesNoStatus holds 100 leases and checks that, once
// they are held, renewals keep them without status writes and in batched
// round trips. LOCKWARDEN_STEADY_DURATION and LOCKWARDEN_STEADY_TTL make the
// same test a longer soak (for example 10m and 30).
func TestHoldingManyLeasesWritesNoStatus(t *testing.T) {
	const leases = 100
	duration := envDuration(t, "LOCKWARDEN_STEADY_DURATION", 12*time.Second)
	ttl := envInt(t, "LOCKWARDEN_STEADY_TTL", 5)

	rdb := redistest.Start(t)
	startManager(t, managerOptions{resync: time.Hour})
	ns := newNamespace(t, nil)
	for i := range leases {
		create(t, makeLock(fmt.Sprintf("l%03d", i), ns, rdb.Addr).keys(fmt.Sprintf("key-%03d", i)).ttl(int32(ttl)).holder(fmt.Sprintf("h%03d", i)).obj())
	}
	eventually(t, 60*time.Second, "every lease held", func() (bool, string) {
		var list locksv1alpha1.DistributedLockList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		held := 0
		var notHeld []string
		for _, dl := range list.Items {
			if meta.IsStatusConditionTrue(dl.Status.Conditions, locksv1alpha1.ConditionHeld) {
				held++
			} else if len(notHeld) < 3 {
				c := meta.FindStatusCondition(dl.Status.Conditions, locksv1alpha1.ConditionHeld)
				notHeld = append(notHeld, fmt.Sprintf("%s: %+v", dl.Name, c))
			}
		}
		return held == leases, fmt.Sprintf("%d of %d held; not held: %s", held, leases, strings.Join(notHeld, "; "))
	})

	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(context.Background(), &locksv1alpha1.DistributedLockList{}, client.InNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	rc := rdb.Client()
	cmdsBefore := redisCommands(t, rc.Info(context.Background(), "stats").Val())
	batchesBefore := testutil.ToFloat64(metrics.RenewalBatches)
	okBefore := testutil.ToFloat64(metrics.Renewals.WithLabelValues(metrics.ResultOK))

	writes := 0
	timeout := time.After(duration)
	// The initial ADDED events replay the current state; only MODIFIED events are writes.
loop:
	for {
		select {
		case ev := <-w.ResultChan():
			if ev.Type == watch.Modified {
				writes++
			}
		case <-timeout:
			break loop
		}
	}
	cmds := redisCommands(t, rc.Info(context.Background(), "stats").Val()) - cmdsBefore
	batches := testutil.ToFloat64(metrics.RenewalBatches) - batchesBefore
	renewals := testutil.ToFloat64(metrics.Renewals.WithLabelValues(metrics.ResultOK)) - okBefore
	t.Logf("%d leases, TTL %ds, %v: %d status writes, %.0f renewals in %.0f batched calls, %d Redis commands (%.1f/s)",
		leases, ttl, duration, writes, renewals, batches, cmds, float64(cmds)/duration.Seconds())

	if writes != 0 {
		t.Errorf("%d status writes while nothing changed, want 0", writes)
	}
	// Every lease was renewed at least once per TTL, or it would be gone.
	if minRenewals := float64(leases) * (duration.Seconds()/float64(ttl) - 1); renewals < minRenewals {
		t.Errorf("%.0f renewals, want at least %.0f", renewals, minRenewals)
	}
	if batches >= renewals/10 {
		t.Errorf("%.0f renewal calls for %.0f renewals: renewals are not batched", batches, renewals)
	}
	for i := range leases {
		key := lockKey(ns, fmt.Sprintf("key-%03d", i))
		if err := rc.Get(context.Background(), key).Err(); err != nil {
			t.Fatalf("lease %s is gone after %v: %v", key, duration, err)
		}
	}
}

func redisCommands(t *testing.T, info string) int64 {
	t.Helper()
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no total_commands_processed in INFO stats")
	return 0
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}
