package bounds

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestJobsThatMustNotRunEndFailedWithoutAPod: behind a running holder, a
// Job with contention Skip, a Job whose maximum wait passes and an older
// Job of a CronJob with contention QueueLatest each end Failed with their
// reason, as `kubectl wait --for=condition=Failed` sees it, and none of
// them ever has a Pod; the holder (whose Pod the Job controller does
// create) and the newest Job of the CronJob are not affected.
func TestJobsThatMustNotRunEndFailedWithoutAPod(t *testing.T) {
	needEnv(t)
	rdb := redistest.Start(t)
	ns := newNamespace(t)
	c := env.Client
	pods := watchPods(t, ns)
	create(t, &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: ns},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys: []string{"billing/ledger"}, TTLSeconds: 30,
			Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{rdb.Addr}}},
		},
	})
	create(t, newJob("holder", ns, map[string]string{locksv1alpha1.AnnotationLock: "billing"}))
	eventually(t, 20*time.Second, "the holder to run and get its Pod", func() (bool, string) {
		return len(pods.of("holder")) > 0, fmt.Sprint(pods.all())
	})

	report := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "report", Namespace: ns, Annotations: map[string]string{
			locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationContention: string(locksv1alpha1.ContentionQueueLatest),
		}},
		Spec: batchv1.CronJobSpec{Schedule: "0 0 * * *", Suspend: ptr.To(true), JobTemplate: batchv1.JobTemplateSpec{Spec: newJob("x", ns, nil).Spec}},
	}
	create(t, report)
	create(t, newJob("skipper", ns, map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationContention: string(locksv1alpha1.ContentionSkip)}))
	create(t, newJob("impatient", ns, map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationMaxWait: "3s"}))
	create(t, ownedBy(newJob("report-1", ns, nil), report))
	create(t, ownedBy(newJob("report-2", ns, nil), report))

	for name, reason := range map[string]string{
		"skipper":   locksv1alpha1.JobReasonSkipped,
		"impatient": locksv1alpha1.JobReasonWaitTimedOut,
		"report-1":  locksv1alpha1.JobReasonSuperseded,
	} {
		var j batchv1.Job
		eventually(t, 30*time.Second, fmt.Sprintf("Job %s Failed=True with reason %s", name, reason), func() (bool, string) {
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &j); err != nil {
				return false, err.Error()
			}
			failed := condition(&j, batchv1.JobFailed)
			return failed != nil && failed.Status == corev1.ConditionTrue && failed.Reason == reason, fmt.Sprintf("conditions %+v", j.Status.Conditions)
		})
		if ft := condition(&j, batchv1.JobFailureTarget); ft == nil || ft.Message != condition(&j, batchv1.JobFailed).Message {
			t.Errorf("Job %s: Failed message %q, FailureTarget %+v: want the same message", name, condition(&j, batchv1.JobFailed).Message, ft)
		}
		if got := pods.of(name); len(got) > 0 {
			t.Errorf("Job %s had Pods %v", name, got)
		}
		eventually(t, 10*time.Second, "lockwarden's finalizer to leave "+name, func() (bool, string) {
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &j); err != nil {
				return false, err.Error()
			}
			return !containsString(j.Finalizers, locksv1alpha1.Finalizer), fmt.Sprint(j.Finalizers)
		})
	}

	// The newest Job of the CronJob still waits, without a Pod; the holder runs on.
	var newest batchv1.Job
	eventually(t, 10*time.Second, "report-2 to show its place in the queue", func() (bool, string) {
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "report-2"}, &newest); err != nil {
			return false, err.Error()
		}
		return newest.Annotations[locksv1alpha1.AnnotationQueuePosition] == "1/1", fmt.Sprint(newest.Annotations)
	})
	if condition(&newest, batchv1.JobFailed) != nil || len(pods.of("report-2")) > 0 {
		t.Errorf("report-2 (the newest) did not keep waiting: conditions %+v, pods %v", newest.Status.Conditions, pods.of("report-2"))
	}
	var holder batchv1.Job
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "holder"}, &holder); err != nil {
		t.Fatal(err)
	}
	if condition(&holder, batchv1.JobFailed) != nil || ptr.Deref(holder.Spec.Suspend, true) {
		t.Errorf("the holder was affected: suspend=%v conditions %+v", ptr.Deref(holder.Spec.Suspend, true), holder.Status.Conditions)
	}
}

func needEnv(t testing.TB) {
	t.Helper()
	if env == nil {
		t.Skip("needs kube-apiserver, etcd and kube-controller-manager (envtest); skipped with -short")
	}
}

// newNamespace creates a namespace with a fresh name for one test.
func newNamespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bounds-"}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

func create(t testing.TB, obj client.Object) {
	t.Helper()
	if err := env.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// newJob returns a runnable Job with the given annotations.
func newJob(name, namespace string, annotations map[string]string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: annotations},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "work", Image: "busybox", Command: []string{"true"}}},
		}}},
	}
}

// ownedBy makes the CronJob the Job's controller, as the CronJob controller does.
func ownedBy(j *batchv1.Job, cj *batchv1.CronJob) *batchv1.Job {
	j.OwnerReferences = append(j.OwnerReferences, metav1.OwnerReference{
		APIVersion: "batch/v1", Kind: "CronJob", Name: cj.Name, UID: cj.UID, Controller: ptr.To(true),
	})
	return j
}

func condition(j *batchv1.Job, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range j.Status.Conditions {
		if j.Status.Conditions[i].Type == t {
			return &j.Status.Conditions[i]
		}
	}
	return nil
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// eventually polls cond every 50ms until it returns true, failing after timeout with the last message.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, msg := cond()
		last = msg
		return ok, nil
	})
	if err != nil {
		t.Fatalf("timed out after %v waiting for %s; last seen: %s", timeout, what, last)
	}
}

// podWatch records every Pod created in a namespace, by the name of its Job.
type podWatch struct {
	mu    sync.Mutex
	byJob map[string][]string
}

func watchPods(t *testing.T, namespace string) *podWatch {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(context.Background(), &corev1.PodList{}, client.InNamespace(namespace))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	p := &podWatch{byJob: map[string][]string{}}
	go func() {
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type != watch.Added {
				continue
			}
			p.mu.Lock()
			job := pod.Labels[batchv1.JobNameLabel]
			p.byJob[job] = append(p.byJob[job], pod.Name)
			p.mu.Unlock()
		}
	}()
	return p
}

func (p *podWatch) of(job string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.byJob[job]...)
}

func (p *podWatch) all() map[string][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string][]string{}
	for k, v := range p.byJob {
		out[k] = append([]string(nil), v...)
	}
	return out
}
