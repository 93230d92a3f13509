package postgres

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
)

// TestReleaseWithTheLimitChanged: a lease renewed and released with another
// limit than it was acquired with (the lock's maxHolders changed while it
// held; the operator rebuilds the lease from the lock as it is now) is still
// found, as a mutex and as a semaphore. The token still decides: a release
// or renewal with another token touches nothing.
func TestReleaseWithTheLimitChanged(t *testing.T) {
	s := pgtest.Start(t)
	cfg := configFor(s)
	l, other := newTestLocker(t, cfg), newTestLocker(t, cfg)
	ctx := ctxFor(t, time.Minute)
	for _, c := range []struct {
		name          string
		acquired, now int
	}{{"mutex-as-semaphore", 1, 3}, {"semaphore-as-mutex", 3, 0}, {"semaphore-as-larger-semaphore", 2, 5}} {
		t.Run(c.name, func(t *testing.T) {
			key := c.name
			lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute, Limit: c.acquired})
			if err != nil {
				t.Fatal(err)
			}
			rebuilt := &lock.Lease{Keys: lease.Keys, Owner: lease.Owner, Fence: lease.Fence, Limit: c.now}
			wrong := *rebuilt
			wrong.Fence++
			if err := l.Release(ctx, &wrong); !errors.Is(err, lock.ErrNotHeld) {
				t.Fatalf("Release with another token = %v, want ErrNotHeld", err)
			}
			if _, err := l.Renew(ctx, rebuilt, time.Minute); err != nil {
				t.Fatalf("Renew with limit %d of a lease acquired with limit %d: %v", c.now, c.acquired, err)
			}
			if err := l.Release(ctx, rebuilt); err != nil {
				t.Fatalf("Release with limit %d of a lease acquired with limit %d: %v", c.now, c.acquired, err)
			}
			if _, err := other.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: time.Minute}); err != nil {
				t.Fatalf("the key after the release: %v", err)
			}
		})
	}
}

// TestSlotOwnersAreDigests: a slot row stores the owner token's digest, as
// a mutex row does (owner_test.go), never the token.
func TestSlotOwnersAreDigests(t *testing.T) {
	s := pgtest.Start(t)
	ctx := ctxFor(t, time.Minute)
	l := newTestLocker(t, configFor(s))
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"slot-digest"}, TTL: time.Minute, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	var stored string
	if err := s.Conn(t).QueryRow(ctx, "SELECT owner FROM "+pgx.Identifier{DefaultSchema}.Sanitize()+".slots WHERE key = $1",
		[]byte("slot-digest")).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != ownerDigest(lease.Owner) || stored == lease.Owner {
		t.Fatalf("slots.owner = %q, want the digest %q of the token", stored, ownerDigest(lease.Owner))
	}
}

// TestSemaphoreFaultHarnessCatchesAMutant is the negative control of the
// semaphore suites: a Locker that asks the database for one slot more than
// its requests' Limit (so a key admits Limit+1 holders) must fail the
// semaphore fault run's exclusion check. Without faults, the clients (Limit
// + 2 of them) keep the key full, and a third holder shows within a run.
func TestSemaphoreFaultHarnessCatchesAMutant(t *testing.T) {
	s := pgtest.Start(t)
	cfg := configFor(s)
	cfg.Schema = "mutant"
	f := serverFaults(func(t *testing.T) lock.Locker {
		return newTestLocker(t, cfg, WithOperationTimeout(faultOpTimeout), withAdmitExtra(1))
	}, nil, 2)
	f.Duration, f.FaultGap = 3*time.Second, 0
	err := locktest.FindViolation(t, 5, f)
	var ex *locktest.ExclusionError
	if !errors.As(err, &ex) {
		t.Fatalf("the semaphore fault harness passed a Locker that admits Limit+1 holders (%v): it cannot catch too many holders", err)
	}
	// And the mutant is the only difference: the same runs of the real
	// Locker pass.
	cfg.Schema = "not_mutant"
	f.NewLocker = func(t *testing.T) lock.Locker {
		return newTestLocker(t, cfg, WithOperationTimeout(faultOpTimeout))
	}
	if err := locktest.FindViolation(t, 1, f); err != nil {
		t.Fatalf("the real Locker under the control's runs: %v", err)
	}
}

// withAdmitExtra is the mutant of the negative control (see
// options.admitExtra).
func withAdmitExtra(n int) Option { return func(o *options) { o.admitExtra = n } }

// TestUpgradeFromSchemaVersion2 is a rolling upgrade across migration 3: a
// mutex lease taken by a version-2 operator (migration 2's functions, called
// as that code calls them) stays valid and is renewed and released by this
// version with its token; and the version-2 operator, still running until
// its pod is gone, never takes a key that semaphore slots hold.
func TestUpgradeFromSchemaVersion2(t *testing.T) {
	s := pgtest.Start(t)
	ctx := ctxFor(t, time.Minute)
	cfg := configFor(s)
	cfg.Schema = "upgrade2"
	migrateTo(t, cfg, 2)
	raw := s.Conn(t)
	owner, err := lock.NewOwnerToken()
	if err != nil {
		t.Fatal(err)
	}
	v2Acquire := func(keys []string, owner string) (bool, int64) {
		t.Helper()
		var ok bool
		var fence int64
		if err := raw.QueryRow(ctx, "SELECT o_ok, o_fence FROM upgrade2.acquire($1, $2, 'v2', 30000, false, 1000, $3)",
			encodeKeys(keys), ownerDigest(owner), lock.MaxFence-1).Scan(&ok, &fence); err != nil {
			t.Fatalf("acquire through schema version 2: %v", err)
		}
		return ok, fence
	}
	keys := []string{"upgrade-a", "upgrade-b"}
	ok, fence := v2Acquire(keys, owner)
	if !ok {
		t.Fatal("acquire through schema version 2: busy")
	}

	upgraded := newTestLocker(t, cfg)
	lease := &lock.Lease{Keys: keys, Owner: owner, Holder: "v2", Fence: fence, TTL: 30 * time.Second}
	renewed, err := upgraded.Renew(ctx, lease, 30*time.Second)
	if err != nil {
		t.Fatalf("Renew after the upgrade of a lease taken under version 2: %v", err)
	}
	var version int
	if err := raw.QueryRow(ctx, "SELECT max(version) FROM upgrade2.schema_migrations").Scan(&version); err != nil || version != LatestSchemaVersion() {
		t.Fatalf("schema version after the upgrade: %d, %v; want %d", version, err, LatestSchemaVersion())
	}
	// The old operator's lease still holds the key against a semaphore.
	if _, err := upgraded.TryAcquire(ctx, lock.Request{Keys: keys[:1], TTL: time.Minute, Limit: 3}); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("a semaphore slot of a key the version-2 lease holds: %v, want ErrNotAcquired", err)
	}
	if err := upgraded.Release(ctx, renewed); err != nil {
		t.Fatalf("Release after the upgrade: %v", err)
	}
	// Slots taken by this version keep the version-2 operator out.
	slot, err := upgraded.TryAcquire(ctx, lock.Request{Keys: keys[:1], TTL: time.Minute, Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	other, err := lock.NewOwnerToken()
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := v2Acquire(keys[:1], other); ok {
		t.Fatal("the version-2 acquire took a key that a semaphore slot holds")
	}
	if err := upgraded.Release(ctx, slot); err != nil {
		t.Fatal(err)
	}
	if ok, f := v2Acquire(keys[:1], other); !ok || f <= slot.Fence {
		t.Fatalf("the version-2 acquire of the freed key: ok %v, fence %d; want a fence above the slot's %d", ok, f, slot.Fence)
	}
}
