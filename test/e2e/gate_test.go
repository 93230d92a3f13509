//go:build e2e

package e2e

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/devcluster"
)

// TestGateHoldsAgainstEdits gates a Job behind a manual holder and tries, as
// the admin user with kubectl, to run it anyway: unsuspend it, take off or
// change its lock label and annotations, forge a fencing token, remove its
// finalizer. config/default's ValidatingAdmissionPolicy refuses each edit
// and names itself; the Job stays gated. Deleting it works, and releases its
// place in the lock's queue.
func TestGateHoldsAgainstEdits(t *testing.T) {
	ctx := t.Context()
	ns := newNamespace(t, "e2e-gate")
	if err := cluster.Client.Create(ctx, newBackendLock(ns, "gate", "gate/db", "maintenance-by-carol")); err != nil {
		t.Fatal(err)
	}
	kubectl(t, "", "wait", "--for=condition=ManualHolderHeld", "dlock/gate", "-n", ns, "--timeout=60s")

	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gated", Annotations: map[string]string{locksv1alpha1.AnnotationLock: "gate"}},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "work", Image: "busybox:1.37", Command: []string{"true"}}},
			}},
		},
	}
	if err := cluster.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the Job to be gated and to wait in the lock's queue", func(ctx context.Context) (bool, error) {
		if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
			return false, err
		}
		dl, err := getLock(ctx, ns, "gate")
		if err != nil {
			return false, err
		}
		return gated(job) && waits(dl, "gated"), nil
	})

	edits := []struct {
		what string
		args []string
	}{
		{"unsuspend it", []string{"patch", "job/gated", "--type=merge", "-p", `{"spec":{"suspend":false}}`}},
		{"remove the lock label", []string{"label", "job/gated", locksv1alpha1.LabelLock + "-"}},
		{"change the lock label", []string{"label", "--overwrite", "job/gated", locksv1alpha1.LabelLock + "=other"}},
		{"remove the lock annotation", []string{"annotate", "job/gated", locksv1alpha1.AnnotationLock + "-"}},
		{"forge a fencing token", []string{"annotate", "job/gated", locksv1alpha1.AnnotationFencingToken + "=9007199254740991"}},
		{"remove the finalizer", []string{"patch", "job/gated", "--type=json", "-p", `[{"op":"remove","path":"/metadata/finalizers"}]`}},
	}
	for _, e := range edits {
		out, stderr, err := kubectlErr(t, append(e.args, "-n", ns)...)
		switch {
		case err == nil:
			t.Errorf("kubectl could %s: %s", e.what, out)
		case !strings.Contains(stderr, "ValidatingAdmissionPolicy '"+devcluster.JobGatePolicy+"'"):
			t.Errorf("kubectl %s (%s) failed without naming the policy %s: %v\n%s", strings.Join(e.args, " "), e.what, devcluster.JobGatePolicy, err, stderr)
		default:
			t.Logf("%s: refused: %s", e.what, strings.TrimSpace(stderr))
		}
	}
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(job), job); err != nil {
		t.Fatal(err)
	}
	if !gated(job) || job.Annotations[locksv1alpha1.AnnotationFencingToken] != "" {
		t.Fatalf("after the refused edits the Job is no longer gated as the webhook gated it: suspend %v, labels %v, annotations %v, finalizers %v",
			job.Spec.Suspend, job.Labels, job.Annotations, job.Finalizers)
	}
	var pods corev1.PodList
	if err := cluster.Client.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) > 0 {
		t.Fatalf("the gated Job has %d Pods", len(pods.Items))
	}

	// Deleting is the way out: kubectl waits until the operator released the
	// Job's place in the queue and removed the finalizer.
	kubectl(t, "", "delete", "job/gated", "-n", ns, "--timeout=60s")
	if err := cluster.Client.Get(ctx, client.ObjectKeyFromObject(job), job); !apierrors.IsNotFound(err) {
		t.Fatalf("after kubectl delete, Get = %v (finalizers %v), want NotFound", err, job.Finalizers)
	}
	waitFor(t, 30*time.Second, "the deleted Job to leave the lock's queue", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "gate")
		return err == nil && !waits(dl, "gated") && len(dl.Status.Waiting) == 0, err
	})
}

// gated reports whether job is gated as the webhook gates it.
func gated(job *batchv1.Job) bool {
	return ptr.Deref(job.Spec.Suspend, false) && job.Labels[locksv1alpha1.LabelLock] == job.Annotations[locksv1alpha1.AnnotationLock] &&
		job.Labels[locksv1alpha1.LabelLock] != "" && slices.Contains(job.Finalizers, locksv1alpha1.Finalizer)
}

// waits reports whether the lock's queue shows the Job named job.
func waits(dl *locksv1alpha1.DistributedLock, job string) bool {
	for _, w := range dl.Status.Waiting {
		if strings.Contains(w.Identity, "/Job/"+job+"/") {
			return true
		}
	}
	return false
}

// TestInlineEndpointOutsideAllowList aims a lock's inline endpoint at
// 127.0.0.2, a loopback address the operator's --endpoint-allow=127.0.0.1/32
// does not cover: the lock reports BackendReady=False with reason
// BackendNotAllowed, and the listener there never sees a connection.
func TestInlineEndpointOutsideAllowList(t *testing.T) {
	ctx := t.Context()
	ns := newNamespace(t, "e2e-endpoints")
	l, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = l.Close() })

	dl := newLock(ns, "loopback", "loopback/x", "someone")
	dl.Spec.Backend.Redis.Endpoints = []string{l.Addr().String()}
	if err := cluster.Client.Create(ctx, dl); err != nil {
		t.Fatal(err)
	}
	var cond *metav1.Condition
	waitFor(t, 30*time.Second, "BackendReady=False with reason BackendNotAllowed", func(ctx context.Context) (bool, error) {
		dl, err := getLock(ctx, ns, "loopback")
		if err != nil {
			return false, err
		}
		cond = meta.FindStatusCondition(dl.Status.Conditions, locksv1alpha1.ConditionBackendReady)
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == locksv1alpha1.ReasonBackendNotAllowed, nil
	})
	t.Logf("BackendReady: %s %s: %s", cond.Status, cond.Reason, cond.Message)
	// A few resync periods (2 s here): the operator keeps refusing without dialing.
	time.Sleep(6 * time.Second)
	if n := accepted.Load(); n > 0 {
		t.Fatalf("the listener at %s, which the endpoint policy refuses, accepted %d connections", l.Addr(), n)
	}
	if dl, err := getLock(ctx, ns, "loopback"); err != nil || conditionStatus(dl, locksv1alpha1.ConditionHeld) == metav1.ConditionTrue {
		t.Fatalf("the lock on a refused endpoint: %v, Held %s", err, conditionStatus(dl, locksv1alpha1.ConditionHeld))
	}
}
