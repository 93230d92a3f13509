package postgres

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// TestRenewAllAcrossBatches: a RenewAll larger than one statement's batch
// renews every lease it holds and reports the lost ones, by index, across
// the batches.
func TestRenewAllAcrossBatches(t *testing.T) {
	s := pgtest.Start(t)
	ctx := ctxFor(t, time.Minute)
	l := newTestLocker(t, configFor(s))
	const n = 3*renewBatchRows + 7
	leases := make([]*lock.Lease, n)
	for i := range leases {
		keys := []string{fmt.Sprintf("batch-%d", i)}
		if i%10 == 0 {
			keys = append(keys, fmt.Sprintf("batch-%d-extra", i))
		}
		le, err := l.TryAcquire(ctx, lock.Request{Keys: keys, TTL: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = le
	}
	lost := map[int]bool{0: true, renewBatchRows - 1: true, renewBatchRows + 1: true, n - 1: true}
	for i := range lost {
		if err := l.Release(ctx, leases[i]); err != nil {
			t.Fatal(err)
		}
	}
	out, errs := l.RenewAll(ctx, leases, time.Minute)
	for i := range leases {
		switch {
		case lost[i] && !errors.Is(errs[i], lock.ErrLost):
			t.Errorf("RenewAll[%d] of a released lease: %v, want ErrLost", i, errs[i])
		case !lost[i] && (errs[i] != nil || out[i] == nil || out[i].Fence != leases[i].Fence || out[i].TTL != time.Minute):
			t.Errorf("RenewAll[%d]: %+v, %v; want the lease renewed for 1m", i, out[i], errs[i])
		}
	}
	st, err := l.Inspect(ctx, []string{"batch-2", "batch-" + fmt.Sprint(n-2)})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range st {
		if !k.Held || time.Until(k.Expires) < 40*time.Second {
			t.Errorf("%s after RenewAll: held %v, expires in %v; want held for about 1m", k.Key, k.Held, time.Until(k.Expires))
		}
	}
}
