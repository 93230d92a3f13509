package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// TestQueueKeyShowsOneLane: queue --key of a lock with keyFrom lists the
// waiting Jobs of that derived key only, with the lane's counts; on a lock
// with fixed keys --key is refused, saying why.
func TestQueueKeyShowsOneLane(t *testing.T) {
	now := time.Date(2027, 3, 1, 2, 10, 0, 0, time.UTC)
	lanes := testLock("deploys", func(dl *locksv1alpha1.DistributedLock) {
		dl.Spec.Keys, dl.Spec.KeyFrom = nil, &locksv1alpha1.KeyFrom{Expression: `"deploy/" + object.metadata.labels["env"]`}
		dl.Status.Holder = nil
		dl.Status.Lanes = &locksv1alpha1.LanesStatus{Keys: 2, Holders: 2, Waiting: 3, Busiest: []locksv1alpha1.LaneStatus{
			{Key: "deploy/prod", Holders: 1, Waiting: 2, FencingToken: 41}, {Key: "deploy/dev", Holders: 1, Waiting: 1, FencingToken: 40}}}
	})
	fixed := testLock("billing", func(*locksv1alpha1.DistributedLock) {})
	waiting := func(name, key, pos string) *batchv1.Job {
		return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, CreationTimestamp: metav1.NewTime(now.Add(-time.Minute)),
			Labels: map[string]string{locksv1alpha1.LabelLock: "deploys"},
			Annotations: map[string]string{locksv1alpha1.AnnotationLock: "deploys", locksv1alpha1.AnnotationKey: key,
				locksv1alpha1.AnnotationQueuePosition: pos}}}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(lanes, fixed,
		waiting("prod-2", "deploy/prod", "1/2"), waiting("prod-3", "deploy/prod", "2/2"), waiting("dev-2", "deploy/dev", "1/1")).Build()
	out := queueOf(t, c, "deploy/prod", now)
	for _, want := range []string{"Key deploy/prod: 1 holding (newest fencing token 41), 2 waiting.", "prod-2", "prod-3", "using 2 derived key(s)",
		"\nSOURCE job: the Job's lockwarden.io/queue-position annotation, its place in the queue of key deploy/prod.\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("queue deploys --key deploy/prod does not show %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "dev-2") {
		t.Errorf("queue --key deploy/prod lists a Job of deploy/dev:\n%s", out)
	}
	// A lane's waiting Pods are not listed, nor those of other namespaces:
	// queue says so and points to why --key, not to status.waiting, which
	// a lock with keyFrom does not have.
	canary := waiting("prod-canary", "deploy/canary", "3/3")
	one := fake.NewClientBuilder().WithScheme(scheme).WithObjects(lanes, canary).Build()
	for key, want := range map[string]string{
		"deploy/canary": "3 waiting, 1 shown: only this namespace's Jobs carry their place in the key's queue (kubectl lockwarden why deploys --key deploy/canary also names waiting Pods):\n",
		"deploy/qa":     "No Job of this namespace waits for key deploy/qa; kubectl lockwarden why deploys --key deploy/qa also names waiting Pods.\n",
	} {
		if out := queueOf(t, one, key, now); !strings.Contains(out, want) || strings.Contains(out, "status.waiting") {
			t.Errorf("queue deploys --key %s does not say %q (or names status.waiting):\n%s", key, want, out)
		}
	}
	if _, err := readQueue(context.Background(), c, ns, "billing", "x"); err == nil || !strings.Contains(err.Error(), "has fixed keys") {
		t.Errorf("--key on a lock with fixed keys: %v", err)
	}
}

// queueOf is what queue deploys --key key prints at now.
func queueOf(t *testing.T, c client.Client, key string, now time.Time) string {
	t.Helper()
	q, err := readQueue(context.Background(), c, ns, "deploys", key)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := q.print(&out, now); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// TestReleaseOfALanesLockNeedsAToken: a lock that derives keys has no
// single holder to default to; with --token the request goes to the
// operator, which finds the token on its key.
func TestReleaseOfALanesLockNeedsAToken(t *testing.T) {
	dl := testLock("deploys", func(dl *locksv1alpha1.DistributedLock) {
		dl.Spec.Keys, dl.Spec.KeyFrom = nil, &locksv1alpha1.KeyFrom{Expression: `"k"`}
		dl.Status.Holder, dl.Status.Holders = nil, nil
	})
	if _, err := releaseTarget(dl, 0); err == nil || !strings.Contains(err.Error(), "name the one to release with --token") {
		t.Errorf("release without --token: %v", err)
	}
	if h, err := releaseTarget(dl, 42); err != nil || h.FencingToken != 42 {
		t.Errorf("release --token 42 = %+v, %v", h, err)
	}
}
