package controllers

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// The manager caches gated Jobs without their pod templates' specs (a
// tenant's Job may carry megabytes of them). The cached copy has none, and
// a Job started from it keeps its containers: the operator changes Jobs
// only by patches, which leave what neither copy has as it is. (Every test
// manager caches Jobs this way.)
func TestLeanJobsKeepTheirTemplates(t *testing.T) {
	job := makeJob("big", "team-a").obj()
	job.Spec.Template.Annotations = map[string]string{"keep": "me"}
	job.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	out, err := LeanJob(job)
	if err != nil {
		t.Fatal(err)
	}
	lean := out.(*batchv1.Job)
	if len(lean.Spec.Template.Spec.Containers) != 0 || lean.ManagedFields != nil || lean.Spec.Template.Annotations["keep"] != "me" {
		t.Fatalf("the cached Job keeps containers %v, managedFields %v, template annotations %v; want no containers, no managedFields, the annotations",
			lean.Spec.Template.Spec.Containers, lean.ManagedFields, lean.Spec.Template.Annotations)
	}

	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	create(t, makeLock("billing", ns, rdb.Addr).obj())
	create(t, makeJob("nightly", ns).lock("billing").obj())
	got := waitRunning(t, env.Client, 15*time.Second, ns, "nightly")
	if c := got.Spec.Template.Spec.Containers; len(c) != 1 || c[0].Name != "work" || c[0].Image != "busybox" {
		t.Errorf("the started Job's containers are %+v; want its own (work, busybox)", c)
	}
	if got.Spec.Template.Annotations[locksv1alpha1.AnnotationFencingToken] == "" {
		t.Errorf("the started Job's pod template annotations %v lack the fencing token", got.Spec.Template.Annotations)
	}
}
