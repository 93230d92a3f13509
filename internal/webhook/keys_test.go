package webhook

import (
	"context"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

// laneLock is a lock that derives its key from the label env.
func laneLock(maxKeys int32) *locksv1alpha1.DistributedLock {
	return &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "deploys", Namespace: "default"},
		Spec: locksv1alpha1.DistributedLockSpec{
			KeyFrom: &locksv1alpha1.KeyFrom{Expression: `"deploy/" + object.metadata.labels["env"]`},
			MaxKeys: maxKeys,
			Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6379"}}},
		},
	}
}

// TestJobGateDerivesTheKey shows what a user of a lock with keyFrom sees at
// admission: the key recorded on the Job, a refusal that names the lock, the
// expression and the missing label, a refusal past maxKeys, and a key the
// backend's policy refuses.
func TestJobGateDerivesTheKey(t *testing.T) {
	running := func(name, key string) *batchv1.Job {
		j := makeJob(name).Label(locksv1alpha1.LabelLock, "deploys").Annotation(locksv1alpha1.AnnotationKey, key).Obj()
		return j
	}
	finished := running("done", "deploy/old")
	finished.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	gate := func(lock *locksv1alpha1.DistributedLock, objs ...client.Object) *JobGate {
		c := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).WithObjects(append(objs, lock)...).Build()
		return &JobGate{Reader: c, APIReader: c}
	}

	job := makeJob("run").Annotation(locksv1alpha1.AnnotationLock, "deploys").Label("env", "prod").
		Annotation(locksv1alpha1.AnnotationKey, "deploy/somebody-elses").Obj()
	if err := gate(laneLock(0)).Default(t.Context(), job); err != nil {
		t.Fatalf("Default: %v", err)
	}
	if got := job.Annotations[locksv1alpha1.AnnotationKey]; got != "deploy/prod" {
		t.Errorf("key annotation = %q, want deploy/prod (the creator's own value replaced)", got)
	}

	noLabel := makeJob("run").Annotation(locksv1alpha1.AnnotationLock, "deploys").Label("team", "a").Obj()
	err := gate(laneLock(0)).Default(t.Context(), noLabel)
	for _, want := range []string{"lock deploys", `"deploy/" + object.metadata.labels["env"]`, "no such key: env", "metadata.annotations[lockwarden.io/lock]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a Job without the label: %v, want an error with %q", err, want)
		}
	}

	// maxKeys 2 with two keys in use (a finished Job's key does not count):
	// a third key is refused, a key in use is not.
	full := gate(laneLock(2), running("a", "deploy/dev"), running("b", "deploy/staging"), finished)
	third := makeJob("run").Annotation(locksv1alpha1.AnnotationLock, "deploys").Label("env", "prod").Obj()
	err = full.Default(t.Context(), third)
	if err == nil || !strings.Contains(err.Error(), "already has 2 derived keys in use (spec.maxKeys 2") || !strings.Contains(err.Error(), `"deploy/prod"`) {
		t.Errorf("a third key past maxKeys 2: %v", err)
	}
	again := makeJob("run").Annotation(locksv1alpha1.AnnotationLock, "deploys").Label("env", "dev").Obj()
	if err := full.Default(t.Context(), again); err != nil {
		t.Errorf("a key already in use at maxKeys: %v", err)
	}

	// The backend's policy judges the derived key as it would a fixed one.
	g := gate(laneLock(0))
	g.Check = func(_ context.Context, dl *locksv1alpha1.DistributedLock) error {
		if len(dl.Spec.Keys) == 1 && strings.HasSuffix(dl.Spec.Keys[0], "/prod") {
			return &backend.PolicyError{Field: "spec.keys[0]", Reason: locksv1alpha1.ReasonScopeNotAllowed, Message: "prod keys are not allowed here"}
		}
		return nil
	}
	prod := makeJob("run").Annotation(locksv1alpha1.AnnotationLock, "deploys").Label("env", "prod").Obj()
	if err := g.Default(t.Context(), prod); err == nil || !strings.Contains(err.Error(), "prod keys are not allowed here") {
		t.Errorf("a key the policy refuses: %v", err)
	}
}

// TestJobGateDropsAKeyOfAFixedLock: only lockwarden gives keys; a Job of a
// lock with fixed keys keeps none its creator wrote.
func TestJobGateDropsAKeyOfAFixedLock(t *testing.T) {
	lock := laneLock(0)
	lock.Spec.KeyFrom, lock.Spec.Keys = nil, []string{"billing"}
	c := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).WithObjects(lock).Build()
	job := makeJob("run").Annotation(locksv1alpha1.AnnotationLock, "deploys").Annotation(locksv1alpha1.AnnotationKey, "x").Obj()
	if err := (&JobGate{Reader: c, APIReader: c}).Default(t.Context(), job); err != nil {
		t.Fatal(err)
	}
	if v, ok := job.Annotations[locksv1alpha1.AnnotationKey]; ok {
		t.Errorf("key annotation %q kept on a Job of a lock with fixed keys", v)
	}
}

// TestPodGateDerivesTheKeyFromTheWorkload: a Pod's owner is its workload.
func TestPodGateDerivesTheKeyFromTheWorkload(t *testing.T) {
	lock := laneLock(0)
	lock.Spec.KeyFrom = &locksv1alpha1.KeyFrom{Expression: `owner.kind + "/" + owner.name`}
	c := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).WithObjects(lock).Build()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", Annotations: map[string]string{locksv1alpha1.AnnotationLock: "deploys"}}}
	err := (&PodGate{Reader: c, APIReader: c}).Default(t.Context(), pod)
	if err == nil || !strings.Contains(err.Error(), `gave "/"`) {
		t.Errorf("a bare Pod (no owner) with an owner-derived key: %v, want the refusal of the key \"/\"", err)
	}
}
