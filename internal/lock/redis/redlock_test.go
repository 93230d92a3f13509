package redis

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// stepClock is a clock.PassiveClock whose every reading is the real time plus
// step times the number of earlier readings: time visibly passes between any
// two readings, so a test can tell whether the engine measured the elapsed
// time of an acquisition on the injected clock.
type stepClock struct {
	step time.Duration
	mu   sync.Mutex
	n    int
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return time.Now().Add(time.Duration(c.n) * c.step)
}

func (c *stepClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// TestRedlockMajorityMasks takes every up/down combination of 5 masters
// (down = killed or paused) and checks that a lease is granted, renewed and
// released if and only if a majority is up, that its validity is at most ttl - elapsed - drift on the
// injected clock, and that a refusal is a quorum error naming the nodes.
func TestRedlockMajorityMasks(t *testing.T) {
	servers := redistest.StartN(t, 5)
	const ttl = 5 * time.Second
	const step = 7 * time.Millisecond
	for mask := range 1 << len(servers) {
		up := bits.OnesCount(uint(mask))
		t.Run(fmt.Sprintf("mask=%05b", mask), func(t *testing.T) {
			// A fresh Locker per mask: go-redis keeps refusing to dial a node
			// for a moment after many failed dials.
			// The per-node timeout is what a paused node costs each call; it
			// is generous enough for a loaded machine.
			l := newTestLocker(t, Config{Addrs: addrs(servers)}, WithNodeTimeout(250*time.Millisecond), WithClock(&stepClock{step: step}))
			ctx := context.Background()
			key := fmt.Sprintf("mask-%d", mask)
			// A lease taken while every node is up, renewed and released under the mask.
			var held *lock.Lease
			err := retryQuorum(true, func() (err error) {
				held, err = l.TryAcquire(ctx, lock.Request{Keys: []string{key + "-held"}, TTL: ttl})
				return err
			})
			if err != nil {
				t.Fatalf("TryAcquire with all nodes up: %v", err)
			}
			var killed, paused []*redistest.Server
			for i, s := range servers {
				if mask&(1<<i) != 0 {
					continue
				}
				if (mask+i)%2 == 0 {
					s.Kill()
					killed = append(killed, s)
				} else {
					s.Pause()
					paused = append(paused, s)
				}
			}
			defer func() {
				for _, s := range paused {
					s.Resume()
				}
				for _, s := range killed {
					s.Restart()
				}
			}()
			var renewed *lock.Lease
			renewErr := retryQuorum(up >= 3, func() (err error) {
				renewed, err = l.Renew(ctx, held, ttl)
				return err
			})
			releaseErr := l.Release(ctx, held)
			if up >= 3 {
				if renewErr != nil || releaseErr != nil {
					t.Fatalf("%d of 5 up: Renew: %v, Release: %v; want both to succeed", up, renewErr, releaseErr)
				}
				// A renewal waiting on paused nodes loses that time from its
				// validity, so Expires may even move earlier; it must stay ahead.
				if !renewed.Expires.After(held.Acquired) || renewed.Fence != held.Fence || renewed.Owner != held.Owner {
					t.Fatalf("renewed lease %+v: want the same fence and owner, Expires after %v", renewed, held.Acquired)
				}
			} else if !errors.Is(renewErr, lock.ErrQuorum) || !errors.Is(releaseErr, lock.ErrQuorum) {
				t.Fatalf("%d of 5 up: Renew: %v, Release: %v; want both to fail with ErrQuorum", up, renewErr, releaseErr)
			}

			var lease *lock.Lease
			err = retryQuorum(up >= 3, func() (err error) {
				lease, err = l.TryAcquire(ctx, lock.Request{Keys: []string{key}, TTL: ttl, Holder: "masks"})
				return err
			})
			if up >= 3 {
				if err != nil {
					t.Fatalf("%d of 5 up: TryAcquire: %v, want a lease", up, err)
				}
				validity := lease.Expires.Sub(lease.Acquired)
				if limit := ttl - step - drift(ttl); validity <= 0 || validity > limit {
					t.Fatalf("validity %v, want in (0, %v] (ttl - elapsed on the injected clock - drift)", validity, limit)
				}
				if err := l.Release(context.Background(), lease); err != nil {
					t.Fatalf("Release with %d of 5 up: %v", up, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("%d of 5 up: got a lease %+v, want a quorum error", up, lease)
			}
			if !errors.Is(err, lock.ErrQuorum) {
				t.Fatalf("%d of 5 up: error %v, want one matching ErrQuorum", up, err)
			}
			var qe *QuorumError
			var ne *lock.NodeError
			if !errors.As(err, &qe) || qe.Agreed > up || qe.Needed != 3 || qe.Total != 5 || !errors.As(err, &ne) {
				t.Fatalf("%d of 5 up: error %#v, want a *QuorumError (at most %d of 5, 3 needed) wrapping *lock.NodeError", up, err, up)
			}
			// The refused attempt released what it took on the nodes that are
			// up (well before the 5s TTL could have removed it).
			for i, s := range servers {
				if mask&(1<<i) == 0 {
					continue
				}
				c := s.Client()
				err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 2*time.Second, true, func(ctx context.Context) (bool, error) {
					n, err := c.Exists(ctx, "{"+key+"}:lock").Result()
					return err == nil && n == 0, nil
				})
				if err != nil {
					t.Fatalf("node %d still has the lock key after a refused acquire", i)
				}
			}
		})
	}
}

// retryQuorum, when majority is set, retries an operation up to three times
// while it fails with ErrQuorum: with a majority up it must succeed, but on a
// loaded machine one try may exceed the per-node timeout. Without a majority
// it tries once (every try must fail, and each waits for the paused nodes).
func retryQuorum(majority bool, f func() error) error {
	tries := 1
	if majority {
		tries = 3
	}
	var err error
	for range tries {
		if err = f(); err == nil || !errors.Is(err, lock.ErrQuorum) {
			return err
		}
	}
	return err
}

// jumpClock jumps forward by jump on its second reading, as if the process
// had stalled in the middle of an acquisition.
type jumpClock struct {
	jump time.Duration
	mu   sync.Mutex
	n    int
}

func (c *jumpClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.n >= 2 {
		return time.Now().Add(c.jump)
	}
	return time.Now()
}

func (c *jumpClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// TestNoValidityNoLease: when the acquisition took longer than the TTL allows
// (measured on the injected clock), no lease is granted and nothing stays
// held, even though every node agreed.
func TestNoValidityNoLease(t *testing.T) {
	servers := redistest.StartN(t, 3)
	single := redistest.Start(t)
	for name, cfg := range map[string]Config{
		"redlock":    {Addrs: addrs(servers)},
		"standalone": {Addrs: []string{single.Addr}},
	} {
		t.Run(name, func(t *testing.T) {
			ttl := time.Second
			l := newTestLocker(t, cfg, WithClock(&jumpClock{jump: ttl - drift(ttl)}))
			_, err := l.TryAcquire(context.Background(), lock.Request{Keys: []string{"slow"}, TTL: ttl})
			want := lock.ErrQuorum
			if len(cfg.Addrs) == 1 {
				want = lock.ErrBackendUnavailable
			}
			if !errors.Is(err, want) {
				t.Fatalf("TryAcquire with no validity left: %v, want an error matching %v", err, want)
			}
			st, err := newTestLocker(t, cfg).Inspect(context.Background(), []string{"slow"})
			if err != nil {
				t.Fatal(err)
			}
			if st[0].Held {
				t.Fatalf("key held after an acquisition without validity: %+v", st[0])
			}
		})
	}
}

// TestRedlockPasswordTLSDB: Redlock over TLS, with a password and a database index.
func TestRedlockPasswordTLSDB(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.WithPassword("pw"), redistest.WithTLS())
	l := newTestLocker(t, Config{Addrs: addrs(servers), Password: "pw", TLS: tlsFor(servers...), DB: 4})
	ctx := context.Background()
	if err := l.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	lease, err := l.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: time.Second})
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	for i, s := range servers {
		conn := s.Client().Conn()
		defer conn.Close()
		if err := conn.Select(ctx, 4).Err(); err != nil {
			t.Fatal(err)
		}
		if v, err := conn.Get(ctx, "{k}:lock").Result(); err != nil || redistest.LeaseOwner(v) != lease.Owner {
			t.Fatalf("node %d, db 4: lock key = %q, %v; want the lease's owner token", i, v, err)
		}
	}
	if err := l.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	wrong := newTestLocker(t, Config{Addrs: addrs(servers), Password: "wrong", TLS: tlsFor(servers...)})
	if err := wrong.Ping(ctx); !errors.Is(err, lock.ErrQuorum) {
		t.Fatalf("Ping with a wrong password: %v, want a quorum error", err)
	}
}
