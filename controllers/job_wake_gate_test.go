package controllers

import (
	"fmt"
	"testing"
	"time"
)

// One backend gets at most its share of the wake workers at once, and a
// backend a namespace chose at most tenantWakeRate wake-ups a second; the
// administrators' backends and every other backend are not held by it.
func TestWakeGateBoundsOneBackend(t *testing.T) {
	g := newWakeGate()
	t0 := time.Unix(1_800_000_000, 0)
	const tenant, other, admin = "LockBackend/team-a/fake", "LockBackend/team-b/redis", "ClusterLockBackend/shared"

	var leaves []func()
	for i := range wakeShare {
		leave, _, ok := g.enter(tenant, t0)
		if !ok {
			t.Fatalf("wake-up %d of %s refused below its share of %d", i+1, tenant, wakeShare)
		}
		leaves = append(leaves, leave)
	}
	if _, retry, ok := g.enter(tenant, t0); ok || retry != wakeRetry {
		t.Fatalf("a wake-up of %s over its share: admitted %v, retry %v; want refused, retry %v", tenant, ok, retry, wakeRetry)
	}
	leave, _, ok := g.enter(other, t0)
	if !ok {
		t.Fatalf("another backend's wake-up refused while %s has its share", tenant)
	}
	leave()
	for _, l := range leaves {
		l()
		l() // a second call changes nothing
	}

	// The rate: a burst, then one per 1/tenantWakeRate.
	admitted := 0
	for range 10 * tenantWakeBurst {
		leave, _, ok := g.enter(tenant, t0)
		if !ok {
			break
		}
		admitted++
		leave()
	}
	// The 1 wake-up of the share check above took a token too.
	if admitted != tenantWakeBurst-wakeShare {
		t.Fatalf("%s was admitted %d wake-ups at once; want its burst of %d less the %d taken", tenant, admitted, tenantWakeBurst, wakeShare)
	}
	if _, retry, ok := g.enter(tenant, t0); ok || retry != time.Second/tenantWakeRate {
		t.Fatalf("over the rate: admitted %v, retry %v; want refused, retry %v", ok, retry, time.Second/tenantWakeRate)
	}
	if leave, _, ok := g.enter(tenant, t0.Add(time.Second/tenantWakeRate)); !ok {
		t.Fatalf("refused one rate interval later")
	} else {
		leave()
	}
	for i := range 10 * tenantWakeBurst {
		leave, _, ok := g.enter(admin, t0)
		if !ok {
			t.Fatalf("the administrators' backend was refused wake-up %d; ClusterLockBackends are not rate-limited", i+1)
		}
		leave()
	}

	// Idle backends are forgotten once their burst is back.
	for i := range 20 {
		leave, _, _ := g.enter(fmt.Sprintf("LockBackend/ns-%d/b", i), t0)
		leave()
	}
	later := t0.Add(keyedLimiterSweep + time.Duration(tenantWakeBurst)*time.Second/tenantWakeRate)
	leave, _, _ = g.enter("LockBackend/new/b", later)
	leave()
	if n := g.size(); n != 1 {
		t.Fatalf("the gate keeps state for %d backends after they were idle; want only the one just used", n)
	}
}
