package bounds

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestDeletedHolderKeepsTheLockUntilItsPodsStop: deleting the Job that
// holds a lock does not stop its pods at once. With the default
// propagation the pods run through their termination grace period; with
// propagation Orphan they run on. The lock stays held, and the next Job
// stays suspended, until those pods have stopped; then the next Job starts
// with a larger fencing token. With the default propagation lockwarden
// marks the deleted Job as failing, so that the Job controller stops its
// pods now rather than the garbage collector after the Job is gone.
//
// There is no kubelet: a pod bound to a node stays Terminating after its
// deletion, as a real one does for its grace period, until the test
// deletes it with grace period 0 (what the kubelet does once the container
// has stopped).
func TestDeletedHolderKeepsTheLockUntilItsPodsStop(t *testing.T) {
	needEnv(t)
	for name, policy := range map[string]metav1.DeletionPropagation{
		"background": metav1.DeletePropagationBackground,
		"orphan":     metav1.DeletePropagationOrphan,
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			c := env.Client
			rdb := redistest.Start(t)
			ns := newNamespace(t)
			create(t, &locksv1alpha1.DistributedLock{
				ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: ns},
				Spec: locksv1alpha1.DistributedLockSpec{
					Keys: []string{"billing/ledger"}, TTLSeconds: 30,
					Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{rdb.Addr}}},
				},
			})
			first := newJob("first", ns, map[string]string{locksv1alpha1.AnnotationLock: "billing"})
			first.Spec.Template.Spec.NodeName = "node-a"
			first.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](3600)
			create(t, first)
			firstToken := waitStarted(t, ns, "first")
			var pod corev1.Pod
			eventually(t, 30*time.Second, "the first Job's pod", func() (bool, string) {
				pods := jobPods(t, ns, first)
				if len(pods) == 0 {
					return false, "none"
				}
				pod = pods[0]
				return true, ""
			})
			create(t, newJob("second", ns, map[string]string{locksv1alpha1.AnnotationLock: "billing"}))
			eventually(t, 30*time.Second, "the second Job to wait in the queue", func() (bool, string) {
				j := getJob(t, ns, "second")
				return j.Annotations[locksv1alpha1.AnnotationQueuePosition] != "", fmt.Sprint(j.Annotations)
			})

			if err := c.Delete(ctx, getJob(t, ns, "first"), client.PropagationPolicy(policy)); err != nil {
				t.Fatal(err)
			}
			note := waitJobEvent(t, ns, "first", locksv1alpha1.EventReleaseWaitsForPods)
			if !strings.Contains(note, pod.Name) || !strings.Contains(note, firstToken) {
				t.Errorf("Event note %q does not name the pod %s and the fencing token %s", note, pod.Name, firstToken)
			}
			switch policy {
			case metav1.DeletePropagationOrphan:
				eventually(t, 30*time.Second, "the garbage collector to orphan the pod", func() (bool, string) {
					p := getPod(t, ns, pod.Name)
					return p != nil && len(p.OwnerReferences) == 0, fmt.Sprintf("%+v", p)
				})
			default:
				eventually(t, 30*time.Second, "the Job controller to stop the deleted Job's pod", func() (bool, string) {
					p := getPod(t, ns, pod.Name)
					return p != nil && p.DeletionTimestamp != nil, fmt.Sprintf("%+v", p)
				})
				j := getJob(t, ns, "first")
				if ft := condition(j, batchv1.JobFailureTarget); ft == nil || ft.Reason != locksv1alpha1.JobReasonDeleted {
					t.Errorf("the deleted holder has no FailureTarget with reason %s: %+v", locksv1alpha1.JobReasonDeleted, j.Status.Conditions)
				}
			}
			// The pod may still run: the lock is still first's.
			if j := getJob(t, ns, "second"); !ptr.Deref(j.Spec.Suspend, false) || j.Annotations[locksv1alpha1.AnnotationFencingToken] != "" {
				t.Fatalf("the second Job started while the first one's pod %s may still run: suspend=%v, annotations %v",
					pod.Name, ptr.Deref(j.Spec.Suspend, false), j.Annotations)
			}

			// The pod stops.
			if err := c.Delete(ctx, &pod, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
				t.Fatal(err)
			}
			secondToken := waitStarted(t, ns, "second")
			if a, b := parseToken(t, firstToken), parseToken(t, secondToken); b <= a {
				t.Errorf("second's fencing token %d is not larger than first's %d", b, a)
			}
			eventually(t, 30*time.Second, "the first Job to be gone", func() (bool, string) {
				var j batchv1.Job
				err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "first"}, &j)
				return apierrors.IsNotFound(err), fmt.Sprintf("%v finalizers %v", err, j.Finalizers)
			})
		})
	}
}

// waitStarted waits until the Job is unsuspended with a fencing token, and
// returns the token.
func waitStarted(t testing.TB, ns, name string) string {
	t.Helper()
	var token string
	eventually(t, 30*time.Second, "Job "+name+" to start with a fencing token", func() (bool, string) {
		j := getJob(t, ns, name)
		token = j.Annotations[locksv1alpha1.AnnotationFencingToken]
		return token != "" && !ptr.Deref(j.Spec.Suspend, true), fmt.Sprintf("suspend %v annotations %v", j.Spec.Suspend, j.Annotations)
	})
	return token
}

func parseToken(t testing.TB, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("fencing token %q: %v", s, err)
	}
	return n
}

func getJob(t testing.TB, ns, name string) *batchv1.Job {
	t.Helper()
	var j batchv1.Job
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &j); err != nil {
		t.Fatalf("get Job %s: %v", name, err)
	}
	return &j
}

// getPod returns the pod, nil when it is gone.
func getPod(t testing.TB, ns, name string) *corev1.Pod {
	t.Helper()
	var p corev1.Pod
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("get pod %s: %v", name, err)
	}
	return &p
}

// jobPods lists the pods of a Job by its name label, which stays on pods
// after the Job is gone.
func jobPods(t testing.TB, ns string, job *batchv1.Job) []corev1.Pod {
	t.Helper()
	var list corev1.PodList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{batchv1.JobNameLabel: job.Name}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// waitJobEvent waits for an Event with the reason on the named object and
// returns its note.
func waitJobEvent(t testing.TB, ns, name, reason string) string {
	t.Helper()
	return waitJobEventWith(t, ns, name, reason, "", func(string) bool { return true })
}

// waitJobEventWith waits for an Event with the reason on the named object
// whose note matches (what says which), and returns its note.
func waitJobEventWith(t testing.TB, ns, name, reason, what string, matches func(note string) bool) string {
	t.Helper()
	var note string
	eventually(t, 30*time.Second, fmt.Sprintf("a %s Event on %s%s", reason, name, what), func() (bool, string) {
		var list eventsv1.EventList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range list.Items {
			if e.Regarding.Name != name {
				continue
			}
			seen = append(seen, e.Reason+": "+e.Note)
			if e.Reason == reason && matches(e.Note) {
				note = e.Note
				return true, ""
			}
		}
		return false, strings.Join(seen, " | ")
	})
	return note
}

// TestEndedPodsDoNotHoldTheLock: a holder with seven pods is deleted
// (propagation Orphan, so its pods run on). The Event names five of them
// and says there are more; pods that end (phase Succeeded or Failed) no
// longer hold the lock, and once all have ended the next Job starts. The
// operator asks the API server only for pods that have not ended.
func TestEndedPodsDoNotHoldTheLock(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	c := env.Client
	rdb := redistest.Start(t)
	ns := newNamespace(t)
	create(t, &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: ns},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys: []string{"billing/ledger"}, TTLSeconds: 30,
			Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{rdb.Addr}}},
		},
	})
	const width = 7
	first := newJob("first", ns, map[string]string{locksv1alpha1.AnnotationLock: "billing"})
	first.Spec.Parallelism, first.Spec.Completions = ptr.To[int32](width), ptr.To[int32](width)
	first.Spec.Template.Spec.NodeName = "node-a"
	create(t, first)
	firstToken := waitStarted(t, ns, "first")
	var pods []corev1.Pod
	eventually(t, 30*time.Second, fmt.Sprintf("the first Job's %d pods", width), func() (bool, string) {
		pods = jobPods(t, ns, first)
		return len(pods) == width, fmt.Sprintf("%d pods", len(pods))
	})
	create(t, newJob("second", ns, map[string]string{locksv1alpha1.AnnotationLock: "billing"}))
	eventually(t, 30*time.Second, "the second Job to wait in the queue", func() (bool, string) {
		j := getJob(t, ns, "second")
		return j.Annotations[locksv1alpha1.AnnotationQueuePosition] != "", fmt.Sprint(j.Annotations)
	})

	if err := c.Delete(ctx, getJob(t, ns, "first"), client.PropagationPolicy(metav1.DeletePropagationOrphan)); err != nil {
		t.Fatal(err)
	}
	note := waitJobEvent(t, ns, "first", locksv1alpha1.EventReleaseWaitsForPods)
	named := 0
	for _, p := range pods {
		if strings.Contains(note, p.Name) {
			named++
		}
	}
	if named != 5 || !strings.Contains(note, "and more") || !strings.Contains(note, firstToken) {
		t.Errorf("Event note %q names %d of the %d pods; want 5, \"and more\" and the fencing token %s", note, named, width, firstToken)
	}

	// Every pod ends, the last one a while after the others.
	end := func(p *corev1.Pod, phase corev1.PodPhase) {
		cur := getPod(t, ns, p.Name)
		before := cur.DeepCopy()
		cur.Status.Phase = phase
		if err := c.Status().Patch(ctx, cur, client.MergeFrom(before)); err != nil {
			t.Fatalf("end pod %s: %v", p.Name, err)
		}
	}
	for i := range pods[:width-1] {
		end(&pods[i], []corev1.PodPhase{corev1.PodSucceeded, corev1.PodFailed}[i%2])
	}
	last := pods[width-1]
	waitJobEventWith(t, ns, "first", locksv1alpha1.EventReleaseWaitsForPods, " naming only the pod still running",
		func(note string) bool { return strings.HasSuffix(note, ": "+last.Name) })
	if j := getJob(t, ns, "second"); !ptr.Deref(j.Spec.Suspend, false) {
		t.Fatalf("the second Job started while the first one's pod %s still runs", last.Name)
	}
	end(&last, corev1.PodSucceeded)
	secondToken := waitStarted(t, ns, "second")
	if a, b := parseToken(t, firstToken), parseToken(t, secondToken); b <= a {
		t.Errorf("second's fencing token %d is not larger than first's %d", b, a)
	}
}
