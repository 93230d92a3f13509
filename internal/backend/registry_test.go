package backend

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/holder"
	redislock "github.com/lockwarden/lockwarden/internal/lock/redis"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// countingReader counts Secret reads that reach the API server.
type countingReader struct {
	client.Reader
	gets atomic.Int64
}

func (c *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c.gets.Add(1)
	return c.Reader.Get(ctx, key, obj, opts...)
}

func TestLocksSharingASecretShareOneClientAndOneRead(t *testing.T) {
	env := kubetest.Start(t)
	rdb := redistest.Start(t, redistest.WithPassword("s3cret"))
	ctx := context.Background()
	if err := env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "redis-auth", Namespace: "default"},
		Data: map[string][]byte{"password": []byte("s3cret")}}); err != nil {
		t.Fatal(err)
	}
	reader := &countingReader{Reader: env.Client}
	var built atomic.Int64
	r := NewRegistry(ctx, reader, func(cfg Config) (Locker, error) {
		built.Add(1)
		return redislock.New(*cfg.Engine.(*redislock.Config))
	}, logr.Discard())

	lockFor := func(i int) *locksv1alpha1.DistributedLock {
		return &locksv1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("l%d", i), Namespace: "default"},
			Spec: locksv1alpha1.DistributedLockSpec{Keys: []string{"k"}, Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{
				Endpoints: []string{rdb.Addr}, PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "redis-auth", Key: "password"},
			}}},
		}
	}
	var first Handle
	for i := range 50 {
		h, err := r.For(ctx, holder.Ref{Kind: "DistributedLock", Namespace: "default", Name: fmt.Sprintf("l%d", i)}, lockFor(i))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = h
		} else if h.Locker != first.Locker {
			t.Fatalf("lock %d got another client than lock 0", i)
		}
	}
	if err := first.Locker.Ping(ctx); err != nil {
		t.Fatalf("the shared client does not reach Redis with the Secret's password: %v", err)
	}
	if got := built.Load(); got != 1 {
		t.Errorf("%d clients built for 50 locks on one backend, want 1", got)
	}
	if got := reader.gets.Load(); got != 1 {
		t.Errorf("the Secret was read %d times for 50 locks, want 1", got)
	}

	// A changed password is picked up once the cached read is older than the TTL.
	r.SetSecretTTL(0)
	var s corev1.Secret
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "redis-auth"}, &s); err != nil {
		t.Fatal(err)
	}
	s.Data["password"] = []byte("rotated")
	if err := env.Client.Update(ctx, &s); err != nil {
		t.Fatal(err)
	}
	h, err := r.For(ctx, holder.Ref{Kind: "DistributedLock", Namespace: "default", Name: "l0"}, lockFor(0))
	if err != nil {
		t.Fatal(err)
	}
	if h.Locker == first.Locker {
		t.Fatal("a changed Secret did not give a new client")
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := h.Locker.Ping(pctx); err == nil {
		t.Fatal("the client built with the rotated (wrong) password reached Redis")
	}

	// When every lock is forgotten, the clients are closed.
	for i := range 50 {
		r.Forget(holder.Ref{Kind: "DistributedLock", Namespace: "default", Name: fmt.Sprintf("l%d", i)})
	}
	if n := r.Len(); n != 0 {
		t.Fatalf("%d backends open after every user left, want 0", n)
	}
	if err := first.Locker.Ping(ctx); err == nil {
		t.Fatal("the first client still answers after it was closed")
	}
}

// TestHealthFollowsTheBackend: a new backend is Connecting until its first
// health check answers; a backend that stops answering is reported down
// (so its locks fail at once) and up again when it answers.
func TestHealthFollowsTheBackend(t *testing.T) {
	rdb := redistest.Start(t)
	ctx := context.Background()
	r := NewRegistry(ctx, nil, func(cfg Config) (Locker, error) { return redislock.New(*cfg.Engine.(*redislock.Config)) }, logr.Discard())
	r.SetHealthInterval(50 * time.Millisecond)
	changes := make(chan error, 16)
	r.OnHealth(func(_ string, err error) { changes <- err })
	dl := lockWith(&locksv1alpha1.RedisBackend{Endpoints: []string{rdb.Addr}})
	h, err := r.For(ctx, holder.Ref{Kind: "DistributedLock", Namespace: "team-a", Name: "billing"}, dl)
	if err != nil {
		t.Fatal(err)
	}
	next := func(what string) error {
		t.Helper()
		select {
		case err := <-changes:
			return err
		case <-time.After(10 * time.Second):
			t.Fatalf("no health change: want %s", what)
			return nil
		}
	}
	if err := next("the first answer"); err != nil {
		t.Fatalf("first health check: %v", err)
	}
	if err := h.Health(); err != nil {
		t.Fatalf("Health after an answer = %v, want nil", err)
	}

	rdb.Pause()
	down := next("down after the backend stopped answering")
	if down == nil || h.Health() == nil {
		t.Fatalf("health after SIGSTOP: change %v, Health %v; want errors", down, h.Health())
	}
	if got := Describe(h.Health()); got != rdb.Addr+": Timeout" {
		t.Errorf("Describe(Health) = %q, want %q", got, rdb.Addr+": Timeout")
	}
	rdb.Resume()
	if err := next("up after the backend answers again"); err != nil || h.Health() != nil {
		t.Fatalf("health after SIGCONT: change %v, Health %v; want nil", err, h.Health())
	}
	if inUse, err := r.HealthOf(h.ID); !inUse || err != nil {
		t.Errorf("HealthOf(%s) = %v, %v; want in use and answering", h.ID, inUse, err)
	}
	r.Forget(holder.Ref{Kind: "DistributedLock", Namespace: "team-a", Name: "billing"})
	if inUse, _ := r.HealthOf(h.ID); inUse {
		t.Error("HealthOf says in use after the last user forgot the backend")
	}
}
