package controllers

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestLockBackendRunsOnItsNamespacesRedisUser: two namespaces share one
// Redis, each through a LockBackend whose Redis user (spec.redis.username)
// may touch only its own namespace's keys and release channels, as
// docs/security.md sets it up. In each namespace a Job waits in the queue
// behind another, is woken by the release when the first one finishes (the
// periodic requeue is far longer than the wait allowed), and runs: nothing
// the operator does for a namespace needs a key or channel of another, or
// one they share.
func TestLockBackendRunsOnItsNamespacesRedisUser(t *testing.T) {
	srv := redistest.Start(t)
	startManager(t, managerOptions{waitRequeue: herdWaitRequeue})
	c := env.Client
	ctx := context.Background()
	namespaces := []string{newNamespace(t, nil), newNamespace(t, nil)}
	for _, ns := range namespaces {
		if err := srv.SetUser(ctx, "lb-"+ns, "pw-"+ns, append(slices.Clone(redistest.LockwardenCommands), redistest.NamespaceACL(ns)...)...); err != nil {
			t.Fatal(err)
		}
		create(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "redis-user", Namespace: ns}, StringData: map[string]string{"password": "pw-" + ns}})
		createBackend(t, ns, locksv1alpha1.LockBackendSpec{
			Store: locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{
				Endpoints: []string{srv.Addr}, Username: "lb-" + ns,
				PasswordSecretRef: &locksv1alpha1.SecretKeyRef{Name: "redis-user", Key: "password"},
			}},
		})
		dl := makeLock("billing", ns).obj()
		dl.Spec.Backend = locksv1alpha1.Backend{BackendRef: &locksv1alpha1.BackendRef{Name: "store"}}
		create(t, dl)
		create(t, makeJob("first", ns).lock("billing").obj())
	}
	for _, ns := range namespaces {
		first := waitRunning(t, c, 20*time.Second, ns, "first")
		create(t, makeJob("second", ns).lock("billing").obj())
		waitPosition(t, ns, "second", "1/1")
		complete(t, c, first)
		waitRunning(t, c, 5*time.Second, ns, "second")
	}
}
