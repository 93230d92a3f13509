package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestBackendWarnsOfEvictingRedis: a LockBackend whose Redis may evict keys
// (maxmemory-policy allkeys-lru) gets StoreConfigured=False naming the
// server, the policy and the fix, and one Warning Event saying the same,
// not one per resync. Once the server is set to noeviction the condition
// turns True and a Normal Event says so.
func TestBackendWarnsOfEvictingRedis(t *testing.T) {
	startManager(t, managerOptions{configCheck: 300 * time.Millisecond, resync: time.Second})
	ns := newNamespace(t, nil)
	s := redistest.Start(t)
	admin := s.Client()
	if err := admin.ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	createBackend(t, ns, locksv1alpha1.LockBackendSpec{Store: locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{s.Addr}}}})
	for _, name := range []string{"billing", "exports"} {
		dl := makeLock(name, ns).holder("maintenance").obj()
		dl.Spec.Keys = []string{name}
		dl.Spec.Backend = locksv1alpha1.Backend{BackendRef: &locksv1alpha1.BackendRef{Name: "store"}}
		create(t, dl)
	}

	c := waitBackendCondition(t, 30*time.Second, ns, "store", metav1.ConditionFalse, locksv1alpha1.ReasonUnsafeSetting, 2)
	if !containsAll(c.Message, s.Addr, "maxmemory-policy allkeys-lru", "CONFIG SET maxmemory-policy noeviction", "redis.conf") {
		t.Fatalf("StoreConfigured message %q does not name the server, the policy found and the fix", c.Message)
	}
	eventually(t, 10*time.Second, "a Warning Event naming the server and the policy",
		eventWith(t, ns, "store", locksv1alpha1.ReasonUnsafeSetting, s.Addr, "allkeys-lru", "CONFIG SET maxmemory-policy noeviction"))

	if err := admin.ConfigSet(context.Background(), "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	waitBackendCondition(t, 30*time.Second, ns, "store", metav1.ConditionTrue, locksv1alpha1.ReasonNoUnsafeSetting, 2)
	eventually(t, 10*time.Second, "a Normal Event saying no unsafe setting is left",
		eventWith(t, ns, "store", locksv1alpha1.ReasonNoUnsafeSetting, "Redis"))

	// The backend was reconciled many times while the policy was unsafe
	// (every second, every settings check, the second lock): the warning
	// was still recorded once.
	var list corev1.EventList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var warnings []string
	for _, e := range list.Items {
		if e.InvolvedObject.Name == "store" && e.Reason == locksv1alpha1.ReasonUnsafeSetting {
			n := e.Count
			if e.Series != nil {
				n = e.Series.Count
			}
			warnings = append(warnings, fmt.Sprintf("%s (%s, count %d)", e.Message, e.Type, n))
			if e.Type != corev1.EventTypeWarning || n > 1 {
				t.Errorf("Event %s: want one Warning", warnings[len(warnings)-1])
			}
		}
	}
	if len(warnings) != 1 {
		t.Errorf("UnsafeSetting Events: %s; want exactly one", strings.Join(warnings, " | "))
	}
}

// waitBackendCondition waits until the LockBackend's StoreConfigured
// condition has the status and reason and it counts locks, returning it.
func waitBackendCondition(t *testing.T, timeout time.Duration, ns, name string, status metav1.ConditionStatus, reason string, locks int32) metav1.Condition {
	t.Helper()
	var got metav1.Condition
	eventually(t, timeout, fmt.Sprintf("StoreConfigured=%s (%s) on LockBackend %s/%s", status, reason, ns, name), func() (bool, string) {
		var b locksv1alpha1.LockBackend
		if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &b); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(b.Status.Conditions, locksv1alpha1.ConditionStoreConfigured)
		if c == nil {
			return false, fmt.Sprintf("no StoreConfigured condition: %+v", b.Status)
		}
		got = *c
		return c.Status == status && c.Reason == reason && b.Status.Locks == locks, fmt.Sprintf("%s %s: %s (locks %d)", c.Status, c.Reason, c.Message, b.Status.Locks)
	})
	return got
}
