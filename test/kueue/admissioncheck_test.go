// Package kueue tests lockwarden as a Kueue admission check controller
// against a real kube-apiserver (envtest) that serves Kueue's own CRDs
// (crds/, Kueue v0.17.0), with lockwarden's manager and webhook as
// cmd/main.go runs them and a real redis-server as the store.
//
// Kueue's manager does not run here: the test plays Kueue's part on the
// Workloads (it creates them for their Jobs, reserves and gives back quota,
// finishes and deletes them, as Kueue's status writes do) and looks at what
// a user sees: the admission check's state and message, the fencing token
// handed to the pods, and the lock in Redis.
package kueue

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/managertest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

const (
	ns        = "default"
	checkName = "lockwarden"
)

// The control plane and a client that knows Kueue's types (TestMain).
var (
	env *kubetest.Env
	c   client.Client
)

// TestMain runs one manager for the suite (controller names are unique per
// process), with the Kueue admission check left on auto, and lockwarden's
// AdmissionCheck. Each test has a lock of its own on a redis-server of its own.
func TestMain(m *testing.M) {
	kubetest.Main(m, "kueue", func(ctx context.Context, e *kubetest.Env, stopped chan<- error) error {
		env = e
		scheme := runtime.NewScheme()
		utilruntime.Must(clientgoscheme.AddToScheme(scheme))
		utilruntime.Must(locksv1alpha1.AddToScheme(scheme))
		utilruntime.Must(kueue.AddToScheme(scheme))
		var err error
		if c, err = client.New(e.Config, client.Options{Scheme: scheme}); err != nil {
			return err
		}
		if err := managertest.Start(ctx, e, e.Config, []string{
			"--leader-election-namespace=" + ns, // the owner key Secret's namespace
			"--endpoint-allow=127.0.0.1/32",     // the tests' Redis servers are on loopback
			"--default-cluster-lock-backend=",
		}, stopped); err != nil {
			return err
		}
		return c.Create(ctx, &kueue.AdmissionCheck{ObjectMeta: metav1.ObjectMeta{Name: checkName}, Spec: kueue.AdmissionCheckSpec{ControllerName: "lockwarden.io/lock"}})
	}, kubetest.WithWebhooks(), withKueueCRDs())
}

// withKueueCRDs installs Kueue's CRDs (crds/) with the control plane.
func withKueueCRDs() kubetest.Option {
	return func(e *envtest.Environment, root string) {
		e.CRDDirectoryPaths = append(e.CRDDirectoryPaths, filepath.Join(root, "test", "kueue", "crds"))
		e.ErrorIfCRDPathMissing = true
	}
}

// waitFor polls cond every 50ms for up to 30s, and says what it last saw.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	last := ""
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) {
			ok, seen := cond()
			last = seen
			return ok, nil
		})
	if err != nil {
		t.Fatalf("timed out waiting for %s; last seen: %s", what, last)
	}
}

type harness struct {
	t    *testing.T
	ctx  context.Context
	c    client.Client
	rdb  *redistest.Server
	lock string
}

// start starts a redis-server and a lock on it named lock, whose Jobs and
// Workloads are named after it.
func start(t *testing.T, lock string) *harness {
	if env == nil {
		t.Skip("needs kube-apiserver and etcd (envtest); skipped with -short")
	}
	rdb := redistest.Start(t)
	h := &harness{t: t, ctx: context.Background(), c: c, rdb: rdb, lock: lock}
	h.create(&locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: lock, Namespace: ns},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys:       []string{"billing/ledger"},
			TTLSeconds: 5,
			Backend:    locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{rdb.Addr}}},
		},
	})
	return h
}

func (h *harness) create(obj client.Object) {
	h.t.Helper()
	if err := h.c.Create(h.ctx, obj); err != nil {
		h.t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// queuedJob creates a Job that names the lock and is queued by Kueue, as
// Kueue's webhook leaves it (suspended), and returns it as lockwarden's
// webhook admitted it.
func (h *harness) queuedJob(name string) *batchv1.Job {
	h.t.Helper()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: h.lock + "-" + name, Namespace: ns,
			Labels:      map[string]string{"kueue.x-k8s.io/queue-name": "team-a"},
			Annotations: map[string]string{locksv1alpha1.AnnotationLock: h.lock}},
		Spec: batchv1.JobSpec{Suspend: new(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "work", Image: "busybox"}},
		}}},
	}
	h.create(job)
	return job
}

// workloadFor creates the Workload Kueue creates for job, with lockwarden's
// admission check Pending, as Kueue adds the checks of its ClusterQueue.
func (h *harness) workloadFor(job *batchv1.Job) *kueue.Workload {
	h.t.Helper()
	wl := &kueue.Workload{
		ObjectMeta: metav1.ObjectMeta{Name: "job-" + job.Name, Namespace: ns,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: new(true)}}},
		Spec: kueue.WorkloadSpec{QueueName: "team-a", PodSets: []kueue.PodSet{{Name: "main", Count: 1, Template: job.Spec.Template}}},
	}
	h.create(wl)
	h.setStatus(wl, func(wl *kueue.Workload) {
		wl.Status.AdmissionChecks = []kueue.AdmissionCheckState{{Name: checkName, State: kueue.CheckStatePending, LastTransitionTime: metav1.Now()}}
	})
	return wl
}

// setStatus changes the Workload's status as Kueue does.
func (h *harness) setStatus(wl *kueue.Workload, change func(*kueue.Workload)) {
	h.t.Helper()
	err := wait.PollUntilContextTimeout(h.ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		var cur kueue.Workload
		if err := h.c.Get(ctx, client.ObjectKeyFromObject(wl), &cur); err != nil {
			return false, err
		}
		change(&cur)
		err := h.c.Status().Update(ctx, &cur)
		return err == nil, client.IgnoreAlreadyExists(ignoreConflict(err))
	})
	if err != nil {
		h.t.Fatalf("update the status of Workload %s: %v", wl.Name, err)
	}
}

func ignoreConflict(err error) error {
	if err != nil && strings.Contains(err.Error(), "the object has been modified") {
		return nil
	}
	return err
}

func (h *harness) condition(wl *kueue.Workload, typ string, status metav1.ConditionStatus, reason string) {
	h.setStatus(wl, func(cur *kueue.Workload) {
		apimeta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: reason})
	})
}

// check returns lockwarden's admission check state on the Workload.
func (h *harness) check(wl *kueue.Workload) (kueue.AdmissionCheckState, bool) {
	var cur kueue.Workload
	if err := h.c.Get(h.ctx, client.ObjectKeyFromObject(wl), &cur); err != nil {
		return kueue.AdmissionCheckState{}, false
	}
	for _, s := range cur.Status.AdmissionChecks {
		if s.Name == checkName {
			return s, true
		}
	}
	return kueue.AdmissionCheckState{}, false
}

// waitCheck waits until the check is in state with a message containing msg.
func (h *harness) waitCheck(wl *kueue.Workload, state kueue.CheckState, msg ...string) kueue.AdmissionCheckState {
	h.t.Helper()
	var got kueue.AdmissionCheckState
	waitFor(h.t, fmt.Sprintf("the admission check of %s to be %s (%q)", wl.Name, state, msg), func() (bool, string) {
		s, ok := h.check(wl)
		got = s
		return ok && s.State == state && containsAll(s.Message, msg), fmt.Sprintf("%s %q", s.State, s.Message)
	})
	return got
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// token returns the fencing token the Ready check hands every pod set.
func (h *harness) token(s kueue.AdmissionCheckState) int64 {
	h.t.Helper()
	if len(s.PodSetUpdates) != 1 || s.PodSetUpdates[0].Name != "main" {
		h.t.Fatalf("pod set updates = %+v, want one for pod set main", s.PodSetUpdates)
	}
	ann := s.PodSetUpdates[0].Annotations
	f, err := strconv.ParseInt(ann[locksv1alpha1.AnnotationFencingToken], 10, 64)
	if err != nil || f <= 0 || !strings.Contains(ann[locksv1alpha1.AnnotationHolder], "/Workload/") {
		h.t.Fatalf("pod annotations of the Ready check = %v, want a fencing token and the Workload as holder", ann)
	}
	return f
}

// reserve reserves quota for the Workload, as Kueue's scheduler does.
func (h *harness) reserve(wl *kueue.Workload) {
	h.condition(wl, kueue.WorkloadQuotaReserved, metav1.ConditionTrue, "QuotaReserved")
}

// TestAdmissionCheckHoldsTheLock: with lockwarden's admission check in the
// ClusterQueue, Jobs that name a lock are admitted one at a time, each with
// a larger fencing token for its pods, and the lock passes on when a
// Workload finishes, is evicted (Kueue gives back its quota) or is deleted.
func TestAdmissionCheckHoldsTheLock(t *testing.T) {
	h := start(t, "billing")

	var ac kueue.AdmissionCheck
	waitFor(t, "lockwarden to mark its AdmissionCheck Active", func() (bool, string) {
		if err := h.c.Get(h.ctx, types.NamespacedName{Name: checkName}, &ac); err != nil {
			return false, err.Error()
		}
		return apimeta.IsStatusConditionTrue(ac.Status.Conditions, kueue.AdmissionCheckActive), fmt.Sprint(ac.Status.Conditions)
	})

	// The webhook leaves a queued Job to Kueue, with the token's variables.
	first := h.queuedJob("first")
	if len(first.Finalizers) > 0 || first.Labels[locksv1alpha1.LabelLock] != "" {
		t.Errorf("a Job Kueue queues was gated by lockwarden: finalizers %v, labels %v", first.Finalizers, first.Labels)
	}
	env := first.Spec.Template.Spec.Containers[0].Env
	if len(env) == 0 || env[0].Name != locksv1alpha1.EnvFencingToken || env[0].ValueFrom == nil ||
		env[0].ValueFrom.FieldRef.FieldPath != "metadata.annotations['lockwarden.io/fencing-token']" {
		t.Errorf("the Job's container has env %+v, want LOCKWARDEN_FENCING_TOKEN from the pod's annotation", env)
	}

	// Waiting for quota: the check stays Pending, nothing is held.
	wlFirst := h.workloadFor(first)
	if s, _ := h.check(wlFirst); s.State != kueue.CheckStatePending {
		t.Fatalf("check before quota = %s, want Pending", s.State)
	}

	// Quota reserved: the lock is acquired and the check Ready with the token.
	h.reserve(wlFirst)
	firstToken := h.token(h.waitCheck(wlFirst, kueue.CheckStateReady, "Holding lock "+h.lock))

	// A second Job waits for the lock while the first holds it, told by whom.
	second := h.queuedJob("second")
	wlSecond := h.workloadFor(second)
	h.reserve(wlSecond)
	h.waitCheck(wlSecond, kueue.CheckStatePending, "Waiting for lock "+h.lock+": held by ", "/default/Workload/job-billing-first/")

	// The first finishes: the second is admitted with a larger token.
	h.condition(wlFirst, kueue.WorkloadFinished, metav1.ConditionTrue, "Succeeded")
	secondToken := h.token(h.waitCheck(wlSecond, kueue.CheckStateReady, "Holding lock "+h.lock))
	if secondToken <= firstToken {
		t.Errorf("second token %d is not larger than the first's %d", secondToken, firstToken)
	}
	h.waitCheck(wlFirst, kueue.CheckStateReady, "Released lock "+h.lock, fmt.Sprintf("fencing token %d", firstToken), "the Workload finished")

	// A third waits; the second is evicted (preempted): Kueue stops its Job
	// and, once the pods stopped, gives back the quota. Only then the lock
	// passes on, and the second's check is Pending again.
	third := h.queuedJob("third")
	wlThird := h.workloadFor(third)
	h.reserve(wlThird)
	h.waitCheck(wlThird, kueue.CheckStatePending, "Waiting for lock "+h.lock)
	h.condition(wlSecond, kueue.WorkloadEvicted, metav1.ConditionTrue, "Preempted")
	if s, _ := h.check(wlThird); s.State != kueue.CheckStatePending {
		t.Fatalf("the third was admitted while the evicted second still had its quota (its pods may still run): %s %q", s.State, s.Message)
	}
	h.condition(wlSecond, kueue.WorkloadQuotaReserved, metav1.ConditionFalse, "Pending")
	thirdToken := h.token(h.waitCheck(wlThird, kueue.CheckStateReady, "Holding lock "+h.lock))
	if thirdToken <= secondToken {
		t.Errorf("third token %d is not larger than the second's %d", thirdToken, secondToken)
	}
	h.waitCheck(wlSecond, kueue.CheckStatePending, "gave back its quota")

	// The evicted second gets quota again: it waits behind the third.
	h.condition(wlSecond, kueue.WorkloadEvicted, metav1.ConditionFalse, "Requeued")
	h.reserve(wlSecond)
	h.waitCheck(wlSecond, kueue.CheckStatePending, "Waiting for lock "+h.lock+": held by ", "/default/Workload/job-billing-third/")

	// The third's Workload is deleted: the second is admitted.
	if err := h.c.Delete(h.ctx, wlThird); err != nil {
		t.Fatal(err)
	}
	if again := h.token(h.waitCheck(wlSecond, kueue.CheckStateReady, "Holding lock "+h.lock)); again <= thirdToken {
		t.Errorf("token after the deletion %d is not larger than the deleted holder's %d", again, thirdToken)
	}
}

// TestLostLeaseSetsRetry: when the store loses the lease of an admitted
// Workload (here Redis loses its data), lockwarden sets its check to Retry,
// so that Kueue evicts it, and says so in an Event on the Workload.
func TestLostLeaseSetsRetry(t *testing.T) {
	h := start(t, "ledger")
	job := h.queuedJob("lost")
	wl := h.workloadFor(job)
	h.reserve(wl)
	h.waitCheck(wl, kueue.CheckStateReady, "Holding lock "+h.lock)

	if err := h.rdb.Client().FlushAll(h.ctx).Err(); err != nil {
		t.Fatal(err)
	}
	h.waitCheck(wl, kueue.CheckStateRetry, "Lost the lease of lock "+h.lock)
	waitFor(t, "a Lost Event on the Workload", func() (bool, string) {
		var events eventsv1.EventList
		if err := h.c.List(h.ctx, &events, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if e.Regarding.Kind == "Workload" && e.Regarding.Name == wl.Name && e.Reason == locksv1alpha1.EventLost {
				return true, e.Note
			}
		}
		return false, fmt.Sprintf("%d events", len(events.Items))
	})
}
