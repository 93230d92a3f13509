package controllers

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// userClient is a client that acts as user (impersonated by the test's admin).
func userClient(t *testing.T, user string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:masters"}}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func annotateLock(t *testing.T, c client.Client, ns, name string, kv map[string]string) error {
	t.Helper()
	dl := getLock(t, ns, name)
	before := dl.DeepCopy()
	if dl.Annotations == nil {
		dl.Annotations = map[string]string{}
	}
	for k, v := range kv {
		dl.Annotations[k] = v
	}
	return c.Patch(context.Background(), dl, client.MergeFrom(before))
}

func eventWith(t *testing.T, ns, name, reason string, subs ...string) func() (bool, string) {
	return func() (bool, string) {
		evs := eventsFor(t, ns, name)
		for _, e := range evs {
			if strings.HasPrefix(e, reason+":") && containsAll(e, subs...) {
				return true, e
			}
		}
		return false, strings.Join(evs, " | ")
	}
}

// TestForceReleaseTakesAStuckLeaseAndSaysWho: an admin takes the lease away
// from a running Job with `kubectl annotate dlock billing
// lockwarden.io/force-release=<token>`. The webhook records who asked, the
// operator releases that lease, names the user and the token in a
// ForceReleased Event on the lock and the Job, and removes the request; the
// Job finds its lease lost, and the next Job in line runs with a larger token.
func TestForceReleaseTakesAStuckLeaseAndSaysWho(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	create(t, makeLock("billing", ns, rdb.Addr).ttl(6).obj())
	create(t, makeJob("stuck", ns).annotate(locksv1alpha1.AnnotationLock, "billing").obj())
	stuck := waitRunning(t, c, 20*time.Second, ns, "stuck")
	create(t, makeJob("next", ns).annotate(locksv1alpha1.AnnotationLock, "billing").obj())
	eventually(t, 20*time.Second, "the second Job to wait in line", func() (bool, string) {
		dl := getLock(t, ns, "billing")
		return len(dl.Status.Waiting) == 1, fmt.Sprintf("%+v", dl.Status.Waiting)
	})
	token := fence(t, stuck)

	const admin = "oncall@example.com"
	// A record forged alongside the request is replaced by who really asked.
	if err := annotateLock(t, userClient(t, admin), ns, "billing", map[string]string{
		locksv1alpha1.AnnotationForceRelease:   strconv.FormatInt(token, 10),
		locksv1alpha1.AnnotationForceReleaseBy: "someone-else",
	}); err != nil {
		t.Fatalf("force-release request: %v", err)
	}
	eventually(t, 20*time.Second, "a ForceReleased event naming the user and the token", eventWith(t, ns, "billing", locksv1alpha1.EventForceReleased, admin, strconv.FormatInt(token, 10), "stuck"))
	if ok, e := eventWith(t, ns, "billing", locksv1alpha1.EventForceReleased, "someone-else")(); ok {
		t.Fatalf("the Event names the forged requester: %s", e)
	}
	eventually(t, 20*time.Second, "the Job's own ForceReleased event", eventWith(t, ns, "stuck", locksv1alpha1.EventForceReleased, admin))
	eventually(t, 20*time.Second, "the request to be removed", func() (bool, string) {
		dl := getLock(t, ns, "billing")
		_, a := dl.Annotations[locksv1alpha1.AnnotationForceRelease]
		_, b := dl.Annotations[locksv1alpha1.AnnotationForceReleaseBy]
		return !a && !b, fmt.Sprintf("%v", dl.Annotations)
	})
	eventually(t, 20*time.Second, "the stuck Job to find its lease lost", func() (bool, string) {
		j := getJob(t, c, ns, "stuck")
		return j.Annotations[locksv1alpha1.AnnotationLost] != "", fmt.Sprintf("%v", j.Annotations)
	})
	next := waitRunning(t, c, 20*time.Second, ns, "next")
	if f := fence(t, next); f <= token {
		t.Fatalf("the next Job got fencing token %d, not larger than the released %d", f, token)
	}
}

// TestForceReleaseStaysInItsLock: a request names only holders that
// acquired through the lock it is set on. A token held through another lock
// on the same keys is refused and its holder keeps the lease; so is a
// request that is not a token, at admission, naming the annotation.
func TestForceReleaseStaysInItsLock(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	create(t, makeLock("first", ns, rdb.Addr).holder("alice").obj())
	first := waitCondition(t, 15*time.Second, ns, "first", locksv1alpha1.ConditionManualHolderHeld, "True", locksv1alpha1.ReasonAcquired)
	create(t, makeLock("second", ns, rdb.Addr).obj())
	eventually(t, 15*time.Second, "the second lock to show alice as holder", func() (bool, string) {
		dl := getLock(t, ns, "second")
		return dl.Status.Holder != nil && dl.Status.Holder.Identity == "alice", fmt.Sprintf("%+v", dl.Status.Holder)
	})

	const tenant = "mallory@example.com"
	if err := annotateLock(t, userClient(t, tenant), ns, "second", map[string]string{
		locksv1alpha1.AnnotationForceRelease: strconv.FormatInt(first.Status.FencingToken, 10),
	}); err != nil {
		t.Fatalf("force-release request: %v", err)
	}
	eventually(t, 20*time.Second, "a ForceReleaseRefused event", eventWith(t, ns, "second", locksv1alpha1.EventForceReleaseRefused, tenant, "no holder that acquired through this lock"))
	if dl := getLock(t, ns, "first"); dl.Status.FencingToken != first.Status.FencingToken || findCond(dl, locksv1alpha1.ConditionManualHolderHeld).Status != "True" {
		t.Fatalf("alice lost her lease to a request on another lock: %+v", dl.Status)
	}

	err := annotateLock(t, userClient(t, tenant), ns, "second", map[string]string{locksv1alpha1.AnnotationForceRelease: "the-stuck-one"})
	if err == nil || !strings.Contains(err.Error(), locksv1alpha1.AnnotationForceRelease) || !strings.Contains(err.Error(), "fencing token") {
		t.Fatalf("a force-release that is not a token was not refused with the annotation named: %v", err)
	}
	// A record without a request is dropped at admission.
	if err := annotateLock(t, userClient(t, tenant), ns, "second", map[string]string{locksv1alpha1.AnnotationForceReleaseBy: "admin"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := getLock(t, ns, "second").Annotations[locksv1alpha1.AnnotationForceReleaseBy]; ok {
		t.Fatalf("a hand-written %s was kept", locksv1alpha1.AnnotationForceReleaseBy)
	}
}

// TestForceReleaseRecordWrittenPastTheWebhookIsRefused: where the webhook
// does not run (kube-system, which it skips, stands for any namespace or
// cluster it does not cover), a user who may update a lock writes a request
// with a record naming an administrator and a seal of their own making. The
// operator refuses it, naming the seal, and the holder keeps its lease.
func TestForceReleaseRecordWrittenPastTheWebhookIsRefused(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	const ns = "kube-system"
	name := "forged-" + strings.ToLower(strconv.FormatInt(time.Now().UnixNano(), 36))
	create(t, makeLock(name, ns, rdb.Addr).holder("alice").obj())
	t.Cleanup(func() {
		dl := getLock(t, ns, name)
		if err := env.Client.Delete(context.Background(), dl); err != nil {
			t.Errorf("delete %s/%s: %v", ns, name, err)
		}
		eventually(t, 20*time.Second, "the lock to be gone", func() (bool, string) {
			var dl locksv1alpha1.DistributedLock
			err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &dl)
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	})
	held := waitCondition(t, 15*time.Second, ns, name, locksv1alpha1.ConditionManualHolderHeld, "True", locksv1alpha1.ReasonAcquired)
	token := strconv.FormatInt(held.Status.FencingToken, 10)

	if err := annotateLock(t, userClient(t, "mallory@example.com"), ns, name, map[string]string{
		locksv1alpha1.AnnotationForceRelease:     token,
		locksv1alpha1.AnnotationForceReleaseBy:   "oncall@example.com",
		locksv1alpha1.AnnotationForceReleaseSeal: strings.Repeat("ab", 32),
	}); err != nil {
		t.Fatalf("force-release request: %v", err)
	}
	eventually(t, 20*time.Second, "a ForceReleaseRefused event naming the seal", eventWith(t, ns, name, locksv1alpha1.EventForceReleaseRefused, locksv1alpha1.AnnotationForceReleaseSeal, "nothing was released"))
	eventually(t, 20*time.Second, "the request to be removed", func() (bool, string) {
		dl := getLock(t, ns, name)
		_, a := dl.Annotations[locksv1alpha1.AnnotationForceRelease]
		_, b := dl.Annotations[locksv1alpha1.AnnotationForceReleaseSeal]
		return !a && !b, fmt.Sprintf("%v", dl.Annotations)
	})
	if ok, e := eventWith(t, ns, name, locksv1alpha1.EventForceReleased)(); ok {
		t.Fatalf("the forged request was carried out: %s", e)
	}
	if dl := getLock(t, ns, name); dl.Status.FencingToken != held.Status.FencingToken || findCond(dl, locksv1alpha1.ConditionManualHolderHeld).Status != "True" {
		t.Fatalf("alice lost her lease to a forged request: %+v", dl.Status)
	}
}

// TestForceReleaseFindsTheTokenOnItsDerivedKey: on a lock that derives a
// key per Job (spec.keyFrom), two Jobs of two keys run at once; a force
// release of the second one's token finds it on its own key, releases it
// there, and leaves the other key's Job running.
func TestForceReleaseFindsTheTokenOnItsDerivedKey(t *testing.T) {
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	lanes := makeLock("deploys", ns, rdb.Addr).ttl(6).obj()
	lanes.Spec.Keys, lanes.Spec.KeyFrom = nil, &locksv1alpha1.KeyFrom{Expression: `"deploy/" + object.metadata.labels["env"]`}
	create(t, lanes)
	for _, env := range []string{"a", "b"} {
		j := makeJob("deploy-"+env, ns).annotate(locksv1alpha1.AnnotationLock, "deploys").obj()
		j.Labels = map[string]string{"env": env}
		create(t, j)
	}
	a := waitRunning(t, c, 20*time.Second, ns, "deploy-a")
	b := waitRunning(t, c, 20*time.Second, ns, "deploy-b")
	if got := b.Annotations[locksv1alpha1.AnnotationKey]; got != "deploy/b" {
		t.Fatalf("Job deploy-b has key %q, want deploy/b", got)
	}
	token := fence(t, b)
	if err := annotateLock(t, userClient(t, "oncall@example.com"), ns, "deploys", map[string]string{
		locksv1alpha1.AnnotationForceRelease: strconv.FormatInt(token, 10),
	}); err != nil {
		t.Fatalf("force-release request: %v", err)
	}
	eventually(t, 20*time.Second, "a ForceReleased event naming deploy-b", eventWith(t, ns, "deploys", locksv1alpha1.EventForceReleased, strconv.FormatInt(token, 10), "deploy-b"))
	eventually(t, 20*time.Second, "deploy-b to find its lease lost", func() (bool, string) {
		j := getJob(t, c, ns, "deploy-b")
		return j.Annotations[locksv1alpha1.AnnotationLost] != "", fmt.Sprintf("%v", j.Annotations)
	})
	if j := getJob(t, c, ns, "deploy-a"); j.Annotations[locksv1alpha1.AnnotationLost] != "" || fence(t, j) != fence(t, a) {
		t.Fatalf("deploy-a, on the other key, lost its lease or changed token: %v", j.Annotations)
	}
}
