package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// now is the clock of the why tests.
var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

const (
	ns          = "team-a"
	oldHolderID = "cluster-a/team-a/Pod/payments-5d8f7c9b4-q7t2m/3f9a1"
)

// testPod builds a Pod as the Pod webhook and controller leave it.
type testPod struct{ *corev1.Pod }

func makePod(name string) testPod {
	return testPod{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: ns, UID: "uid-" + types.UID(name),
		CreationTimestamp: metav1.NewTime(now.Add(-15 * time.Minute)),
	}}}
}

// gated is a Pod the webhook gated for lock: label, annotations, gate, finalizer.
func (p testPod) gated(lock string) testPod {
	p.Labels = map[string]string{locksv1alpha1.LabelLock: lock}
	p.annotate(locksv1alpha1.AnnotationLock, lock, locksv1alpha1.AnnotationHolderMode, "Pod")
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: locksv1alpha1.SchedulingGate}}
	p.Finalizers = []string{locksv1alpha1.Finalizer}
	return p
}

func (p testPod) annotate(kv ...string) testPod {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		p.Annotations[kv[i]] = kv[i+1]
	}
	return p
}

// of records the Pod's workload as the webhook does.
func (p testPod) of(kind, name string) testPod {
	return p.annotate(locksv1alpha1.AnnotationWorkload, kind+"/"+name+"/0c6d1e2f-aaaa")
}

// holding is the Pod after the controller acquired for it: token, holder, no gate.
func (p testPod) holding(fence, holderID string) testPod {
	p.annotate(locksv1alpha1.AnnotationFencingToken, fence, locksv1alpha1.AnnotationHolder, holderID)
	p.Spec.SchedulingGates = nil
	p.Spec.NodeName = "node-1"
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	return p
}

func (p testPod) deleting(grace int64) testPod {
	p.DeletionTimestamp = ptr.To(metav1.NewTime(now.Add(-time.Minute)))
	p.DeletionGracePeriodSeconds = ptr.To(grace)
	return p
}

func (p testPod) obj() *corev1.Pod { return p.Pod }

func testLock(name string, mutate ...func(*locksv1alpha1.DistributedLock)) *locksv1alpha1.DistributedLock {
	dl := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys: []string{name + "/main"}, TTLSeconds: 30, MaxHolders: 1, OnLost: locksv1alpha1.OnLostIgnore,
			Backend: locksv1alpha1.Backend{ClusterBackendRef: &locksv1alpha1.ClusterBackendRef{Name: "shared-redis"}},
		},
	}
	for _, m := range mutate {
		m(dl)
	}
	return dl
}

// heldByPod sets the lock's status as the operator writes it for one holder.
func heldByPod(identity string, fence int64) func(*locksv1alpha1.DistributedLock) {
	return func(dl *locksv1alpha1.DistributedLock) {
		acquired := metav1.NewTime(now.Add(-20 * time.Minute))
		h := locksv1alpha1.HolderStatus{Identity: identity, Cluster: "cluster-a", Lock: dl.Name, Kind: "Pod", Namespace: ns, Name: "payments-5d8f7c9b4-q7t2m"}
		dl.Status.Holder = &h
		dl.Status.FencingToken = fence
		dl.Status.AcquiredTime = &acquired
		h.FencingToken, h.AcquiredTime = fence, &acquired
		dl.Status.Holders = []locksv1alpha1.HolderStatus{h}
		dl.Status.HolderCount = ptr.To[int32](1)
	}
}

// The Pod of every state a gated Pod goes through, and the Pods lockwarden
// leaves alone, explained in words that name the lock, the holder and what
// happens next.
func TestWhyExplainsAPod(t *testing.T) {
	waitingFor := "held by " + oldHolderID + " (fencing token 41); 1 waiter ahead"
	objs := []client.Object{
		testLock("payments", heldByPod(oldHolderID, 41)),
		testLock("ledger", heldByPod("cluster-a/team-a/StatefulSet/ledger/0c6d1", 7), func(dl *locksv1alpha1.DistributedLock) {
			dl.Spec.OnLost = locksv1alpha1.OnLostTerminate
			dl.Status.Holder.Kind, dl.Status.Holder.Name = "StatefulSet", "ledger"
		}),
		testLock("web", heldByPod("cluster-a/team-a/Pod/web-6b7c8d9f4-abcde/77e01", 12), func(dl *locksv1alpha1.DistributedLock) {
			dl.Status.Conditions = []metav1.Condition{{
				Type: locksv1alpha1.ConditionRolloutBlocked, Status: metav1.ConditionTrue, Reason: locksv1alpha1.EventRolloutBlocked,
				Message: "The rolling update of Deployment web waits for this lock, which its old Pod web-6b7c8d9f4-abcde holds (fencing token 12)",
			}}
		}),
		testLock("exports", heldByPod("cluster-a/team-a/Pod/exports-0/aaaaa", 21), func(dl *locksv1alpha1.DistributedLock) {
			dl.Spec.MaxHolders = 2
			second := dl.Status.Holders[0]
			second.Identity, second.Name, second.FencingToken = "cluster-b/team-a/Pod/exports-0/bbbbb", "exports-0", 22
			dl.Status.Holders = append(dl.Status.Holders, second)
			dl.Status.HolderCount, dl.Status.Slots = ptr.To[int32](2), "2/2"
		}),

		makePod("payments-waiting").gated("payments").of("Deployment", "payments").
			annotate(locksv1alpha1.AnnotationQueuePosition, "2/3", locksv1alpha1.AnnotationWaitingFor, waitingFor).obj(),
		makePod("payments-new").gated("payments").of("Deployment", "payments").obj(),
		makePod("payments-5d8f7c9b4-q7t2m").gated("payments").of("Deployment", "payments").holding("41", oldHolderID).obj(),
		makePod("ledger-1").gated("ledger").of("StatefulSet", "ledger").annotate(locksv1alpha1.AnnotationHolderMode, "Workload").obj(),
		makePod("ledger-0").gated("ledger").of("StatefulSet", "ledger").annotate(locksv1alpha1.AnnotationHolderMode, "Workload").
			holding("7", "cluster-a/team-a/StatefulSet/ledger/0c6d1").obj(),
		func() *corev1.Pod {
			p := makePod("payments-lost").gated("payments").holding("40", "cluster-a/team-a/Pod/payments-lost/1a2b3").
				annotate(locksv1alpha1.AnnotationLost, "2026-12-01T11:50:00Z: the lease expired during a backend outage").obj()
			p.Status.Conditions = []corev1.PodCondition{{Type: locksv1alpha1.PodConditionLockHeld, Status: corev1.ConditionFalse, Reason: locksv1alpha1.ReasonLost, Message: "The lease of lock payments (fencing token 40) was lost"}}
			return p
		}(),
		func() *corev1.Pod {
			p := makePod("ledger-2").gated("ledger").of("StatefulSet", "ledger").annotate(locksv1alpha1.AnnotationHolderMode, "Workload").
				holding("5", "cluster-a/team-a/StatefulSet/ledger/0c6d1").obj()
			p.Status.Conditions = []corev1.PodCondition{{Type: locksv1alpha1.PodConditionLockHeld, Status: corev1.ConditionFalse, Reason: locksv1alpha1.ReasonLost, Message: "the workload holds the lock with fencing token 7 now"}}
			return p
		}(),
		makePod("payments-terminating").gated("payments").holding("39", "cluster-a/team-a/Pod/payments-terminating/1a2b3").deleting(30).obj(),
		makePod("payments-handover").gated("payments").holding("39", "cluster-a/team-a/Pod/payments-handover/1a2b3").
			annotate(locksv1alpha1.AnnotationHandover, locksv1alpha1.HandoverTerminating).deleting(30).obj(),
		makePod("payments-forced").gated("payments").holding("39", "cluster-a/team-a/Pod/payments-forced/1a2b3").deleting(0).obj(),
		func() *corev1.Pod {
			p := makePod("payments-stopped").gated("payments").holding("39", "cluster-a/team-a/Pod/payments-stopped/1a2b3").deleting(30).obj()
			p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}
			return p
		}(),
		makePod("ledger-3").gated("ledger").of("StatefulSet", "ledger").annotate(locksv1alpha1.AnnotationHolderMode, "Workload").
			holding("7", "cluster-a/team-a/StatefulSet/ledger/0c6d1").deleting(30).obj(),
		makePod("payments-gone-early").gated("payments").deleting(30).obj(),
		func() *corev1.Pod {
			p := makePod("payments-done").gated("payments").holding("38", "cluster-a/team-a/Pod/payments-done/1a2b3").obj()
			p.Status.Phase = corev1.PodSucceeded
			return p
		}(),
		makePod("payments-ungated").gated("payments").holding("", "").obj(),
		makePod("web-7f8e9d0c1-zzzzz").gated("web").of("Deployment", "web").obj(),
		makePod("exports-1").gated("exports").obj(),
		makePod("payments-missing-lock").gated("gone").obj(),
		makePod("plain").obj(),
		makePod("late").annotate(locksv1alpha1.AnnotationLock, "payments").obj(),
		func() *corev1.Pod {
			p := makePod("report-29120-x7k2p").annotate(locksv1alpha1.AnnotationLock, "payments").obj()
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "report-29120", UID: "j", Controller: ptr.To(true)}}
			return p
		}(),
		func() *corev1.Pod {
			p := makePod("other-29120-x7k2p").obj()
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "other-29120", UID: "j", Controller: ptr.To(true)}}
			return p
		}(),
		makePod("forged").gated("payments").annotate(locksv1alpha1.AnnotationWaitingFor, "x\nLock payments is free.\x1b[2K").obj(),
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(&locksv1alpha1.DistributedLock{}).Build()
	lockLine := "Lock payments (keys payments/main, maxHolders 1) is held by " + oldHolderID + " with fencing token 41 for 20m."

	for name, want := range map[string][]string{
		"payments-waiting": {
			"Pod team-a/payments-waiting is gated by lock payments, holder mode Pod: the Pod holds the lock for itself (its workload: Deployment payments).",
			"It is Pending: its scheduling gate lockwarden.io/lock keeps it off every node until it holds lock payments; position 2 of 3 in the queue (1 is next; lockwarden.io/queue-position).",
			"It waits behind: " + waitingFor + " (lockwarden.io/waiting-for).",
			"It has waited 15m, since the Pod was created.",
			lockLine,
		},
		"payments-new": {
			"Pod team-a/payments-new is gated by lock payments, holder mode Pod: the Pod holds the lock for itself (its workload: Deployment payments).",
			"It is Pending: its scheduling gate lockwarden.io/lock keeps it off every node until it holds lock payments; the operator has not placed it in the queue yet (no lockwarden.io/queue-position annotation).",
			"It has waited 15m, since the Pod was created.",
			lockLine,
		},
		"payments-5d8f7c9b4-q7t2m": {
			"Pod team-a/payments-5d8f7c9b4-q7t2m is gated by lock payments, holder mode Pod: the Pod holds the lock for itself (its workload: Deployment payments).",
			"It is not gated any more: it holds lock payments as " + oldHolderID + " with fencing token 41 (its LOCKWARDEN_FENCING_TOKEN environment variable).",
			lockLine,
		},
		"ledger-1": {
			"Pod team-a/ledger-1 is gated by lock ledger, holder mode Workload: its StatefulSet ledger holds the lock once for all its Pods in this cluster, and they run together with its fencing token.",
			"It is Pending: its scheduling gate lockwarden.io/lock keeps it off every node until its StatefulSet ledger holds lock ledger (or finds that another of its Pods acquired it already); the operator has not placed it in the queue yet (no lockwarden.io/queue-position annotation).",
			"It has waited 15m, since the Pod was created.",
			"Lock ledger (keys ledger/main, maxHolders 1) is held by cluster-a/team-a/StatefulSet/ledger/0c6d1 with fencing token 7 for 20m.",
		},
		"ledger-0": {
			"Pod team-a/ledger-0 is gated by lock ledger, holder mode Workload: its StatefulSet ledger holds the lock once for all its Pods in this cluster, and they run together with its fencing token.",
			"It is not gated any more: its StatefulSet ledger holds lock ledger as cluster-a/team-a/StatefulSet/ledger/0c6d1 with fencing token 7 (the Pod's LOCKWARDEN_FENCING_TOKEN environment variable).",
			"Lock ledger (keys ledger/main, maxHolders 1) is held by cluster-a/team-a/StatefulSet/ledger/0c6d1 with fencing token 7 for 20m.",
		},
		"payments-lost": {
			"Pod team-a/payments-lost is gated by lock payments, holder mode Pod: the Pod holds the lock for itself.",
			"It lost its lease on lock payments (lockwarden.io/lost: 2026-12-01T11:50:00Z: the lease expired during a backend outage).",
			"It held the lock with fencing token 40; a resource that checks fencing tokens refuses its writes once a newer holder wrote.",
			"The lock's onLost is Ignore: the Pod runs on without the lock.",
			lockLine,
		},
		"ledger-2": {
			"Pod team-a/ledger-2 is gated by lock ledger, holder mode Workload: its StatefulSet ledger holds the lock once for all its Pods in this cluster, and they run together with its fencing token.",
			"It lost its lease on lock ledger (condition lockwarden.io/LockHeld=False, reason Lost: the workload holds the lock with fencing token 7 now).",
			"It held the lock with fencing token 5; a resource that checks fencing tokens refuses its writes once a newer holder wrote.",
			"The lock's onLost is Terminate: lockwarden evicts the Pod, and its workload creates a gated Pod in its place.",
			"Lock ledger (keys ledger/main, maxHolders 1) is held by cluster-a/team-a/StatefulSet/ledger/0c6d1 with fencing token 7 for 20m.",
		},
		"payments-terminating": {
			"Pod team-a/payments-terminating is gated by lock payments, holder mode Pod: the Pod holds the lock for itself.",
			"It is terminating and still counts as holding lock payments: once the Pod's containers have stopped (not when deletion starts), lockwarden releases the lease it holds with fencing token 39. A forced deletion (--grace-period=0 --force) lets go at once.",
			lockLine,
		},
		"payments-handover": {
			"Pod team-a/payments-handover is gated by lock payments, holder mode Pod: the Pod holds the lock for itself.",
			"It is terminating and hands the lock over at once (lockwarden.io/handover: Terminating): lockwarden releases the lease it holds with fencing token 39 now, while its containers may still run for their grace period; the next holder gets a larger fencing token.",
			lockLine,
		},
		"payments-forced": {
			"Pod team-a/payments-forced is gated by lock payments, holder mode Pod: the Pod holds the lock for itself.",
			"It was force-deleted (grace period 0), which says its containers have stopped: lockwarden releases the lease it holds with fencing token 39 at once.",
			lockLine,
		},
		"payments-stopped": {
			"Pod team-a/payments-stopped is gated by lock payments, holder mode Pod: the Pod holds the lock for itself.",
			"It is terminating and its containers have stopped: lockwarden releases the lease it holds with fencing token 39, then removes its finalizer locks.lockwarden.io/release.",
			lockLine,
		},
		"ledger-3": {
			"Pod team-a/ledger-3 is gated by lock ledger, holder mode Workload: its StatefulSet ledger holds the lock once for all its Pods in this cluster, and they run together with its fencing token.",
			"It is terminating and still counts as holding lock ledger: once the Pod's containers have stopped (not when deletion starts), it stops keeping the lease of StatefulSet ledger (fencing token 7). A forced deletion (--grace-period=0 --force) lets go at once.",
			"In holder mode Workload the lease is released when no Pod of StatefulSet ledger in this cluster keeps it any more.",
			"Lock ledger (keys ledger/main, maxHolders 1) is held by cluster-a/team-a/StatefulSet/ledger/0c6d1 with fencing token 7 for 20m.",
		},
		"payments-gone-early": {
			"Pod team-a/payments-gone-early is gated by lock payments, holder mode Pod: the Pod holds the lock for itself.",
			"It is being deleted before it held lock payments: it leaves the queue, and lockwarden then removes its finalizer locks.lockwarden.io/release.",
			lockLine,
		},
		"payments-done": {
			"Pod team-a/payments-done is gated by lock payments, holder mode Pod: the Pod holds the lock for itself.",
			"It has finished (phase Succeeded) and no longer takes part in lock payments.",
			"It ran with fencing token 38; lockwarden releases that lease, then removes its finalizer locks.lockwarden.io/release.",
			lockLine,
		},
		"payments-ungated": {
			"Pod team-a/payments-ungated is gated by lock payments, holder mode Pod: the Pod holds the lock for itself.",
			"Its scheduling gate lockwarden.io/lock was removed, but it does not hold lock payments (it has no lockwarden.io/fencing-token annotation): someone other than lockwarden removed the gate, and lockwarden deletes the Pod so that its workload creates a gated one.",
			lockLine,
		},
		"web-7f8e9d0c1-zzzzz": {
			"Pod team-a/web-7f8e9d0c1-zzzzz is gated by lock web, holder mode Pod: the Pod holds the lock for itself (its workload: Deployment web).",
			"It is Pending: its scheduling gate lockwarden.io/lock keeps it off every node until it holds lock web; the operator has not placed it in the queue yet (no lockwarden.io/queue-position annotation).",
			"It has waited 15m, since the Pod was created.",
			"Lock web (keys web/main, maxHolders 1) is held by cluster-a/team-a/Pod/web-6b7c8d9f4-abcde/77e01 with fencing token 12 for 20m.",
			"Its rollout is blocked (condition RolloutBlocked): The rolling update of Deployment web waits for this lock, which its old Pod web-6b7c8d9f4-abcde holds (fencing token 12)",
		},
		"exports-1": {
			"Pod team-a/exports-1 is gated by lock exports, holder mode Pod: the Pod holds the lock for itself.",
			"It is Pending: its scheduling gate lockwarden.io/lock keeps it off every node until it holds lock exports; the operator has not placed it in the queue yet (no lockwarden.io/queue-position annotation).",
			"It has waited 15m, since the Pod was created.",
			"Lock exports (keys exports/main, maxHolders 2) is held by cluster-a/team-a/Pod/exports-0/aaaaa with fencing token 21 for 20m and by 1 other holder(s) (slots 2/2).",
			"Its holders: cluster-a/team-a/Pod/exports-0/aaaaa (fencing token 21), cluster-b/team-a/Pod/exports-0/bbbbb (fencing token 22).",
		},
		"payments-missing-lock": {
			"Pod team-a/payments-missing-lock is gated by lock gone, holder mode Pod: the Pod holds the lock for itself.",
			`It is Pending: its scheduling gate lockwarden.io/lock keeps it off every node until it holds lock gone, but lock "gone" not found in namespace "team-a" (its locks: exports, ledger, payments, web). It starts once the lock exists and it gets its turn.`,
		},
		"plain": {
			"Pod team-a/plain is not gated by lockwarden: it has no lockwarden.io/lock annotation (on the Pod, from its pod template).",
		},
		"late": {
			"Pod team-a/late names lock payments but lockwarden has not gated it: it has no lockwarden.io/lock label, so the admission webhook did not gate it when it was created (was the annotation added later, or was the Pod created before the webhook ran, or in a namespace it skips?). It runs without the lock.",
		},
		"report-29120-x7k2p": {
			"Pod team-a/report-29120-x7k2p belongs to Job report-29120, which lockwarden gates as a whole (it never gates a Job's Pods): ask kubectl lockwarden why job/report-29120.",
		},
		"other-29120-x7k2p": {
			"Pod team-a/other-29120-x7k2p is not gated by lockwarden: it has no lockwarden.io/lock annotation. It belongs to Job other-29120; if that Job is gated, lockwarden gates the Job, not its Pods: ask kubectl lockwarden why job/other-29120.",
		},
		"forged": {
			"Pod team-a/forged is gated by lock payments, holder mode Pod: the Pod holds the lock for itself.",
			"It is Pending: its scheduling gate lockwarden.io/lock keeps it off every node until it holds lock payments; the operator has not placed it in the queue yet (no lockwarden.io/queue-position annotation).",
			`It waits behind: x\nLock payments is free.\x1b[2K (lockwarden.io/waiting-for).`,
			"It has waited 15m, since the Pod was created.",
			lockLine,
		},
	} {
		t.Run(name, func(t *testing.T) {
			var out strings.Builder
			if err := why(context.Background(), c, ns, "pod/"+name, &out, now); err != nil {
				t.Fatalf("why pod/%s: %v", name, err)
			}
			if diff := cmp.Diff(strings.Join(want, "\n")+"\n", out.String()); diff != "" {
				t.Errorf("why pod/%s (-want,+got):\n%s", name, diff)
			}
		})
	}
}

// why takes job/NAME, pod/NAME or a bare NAME (a Job first, then a Pod).
func TestWhyFindsAJobOrAPod(t *testing.T) {
	objs := []client.Object{
		testLock("payments"),
		&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "both", Namespace: ns}},
		makePod("both").obj(),
		makePod("only-pod").obj(),
		&batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "only-job", Namespace: ns}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	for name, tc := range map[string]struct {
		arg, want, err string
	}{
		"a bare name is a Job first": {arg: "both", want: "Job team-a/both is not gated"},
		"job/NAME":                   {arg: "job/both", want: "Job team-a/both is not gated"},
		"jobs.batch/NAME":            {arg: "jobs.batch/only-job", want: "Job team-a/only-job is not gated"},
		"pod/NAME":                   {arg: "pod/both", want: "Pod team-a/both is not gated"},
		"po/NAME":                    {arg: "po/only-pod", want: "Pod team-a/only-pod is not gated"},
		"a bare name without a Job":  {arg: "only-pod", want: "Pod team-a/only-pod is not gated"},
		"neither":                    {arg: "nope", err: `job "nope" not found in namespace "team-a", nor a pod of that name`},
		"job/NAME of a Pod":          {arg: "job/only-pod", err: `job "only-pod" not found in namespace "team-a"`},
		"pod/NAME of a Job":          {arg: "pod/only-job", err: `pod "only-job" not found in namespace "team-a"`},
		"another kind":               {arg: "deployment/web", err: `why explains a Job or a Pod: name it as JOB, job/NAME or pod/NAME, not "deployment/web"`},
		"no name":                    {arg: "pod/", err: `why explains a Job or a Pod: name it as JOB, job/NAME or pod/NAME, not "pod/"`},
	} {
		t.Run(name, func(t *testing.T) {
			var out strings.Builder
			err := why(context.Background(), c, ns, tc.arg, &out, now)
			switch {
			case tc.err != "":
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("why %s: error %v, want %q", tc.arg, err, tc.err)
				}
			case err != nil:
				t.Errorf("why %s: %v", tc.arg, err)
			case !strings.HasPrefix(out.String(), tc.want):
				t.Errorf("why %s printed %q, want it to start with %q", tc.arg, out.String(), tc.want)
			}
		})
	}
}
