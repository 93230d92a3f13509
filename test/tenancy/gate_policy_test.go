package tenancy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// The lock the tests' Jobs name. No DistributedLock is needed: no webhook
// checks it here.
const testLock = "billing"

// holdLock writes what lockwarden writes once a Job acquired its lock: the
// fencing token and holder on the Job and its pod template; unsuspend
// unsuspends it in the same change.
func holdLock(token string, unsuspend bool) func(*batchv1.Job) {
	return func(j *batchv1.Job) {
		for _, m := range []*map[string]string{&j.Annotations, &j.Spec.Template.Annotations} {
			if *m == nil {
				*m = map[string]string{}
			}
			(*m)[locksv1alpha1.AnnotationFencingToken] = token
			(*m)[locksv1alpha1.AnnotationHolder] = "default/" + j.Namespace + "/" + j.Name
		}
		if unsuspend {
			j.Spec.Suspend = new(false)
		}
	}
}

// patchJob reads job, applies change and sends the difference as a JSON
// merge patch (what kubectl patch, label and annotate send) as c.
func patchJob(t *testing.T, c client.Client, job *batchv1.Job, change func(*batchv1.Job)) error {
	t.Helper()
	ctx := context.Background()
	var cur batchv1.Job
	if err := operatorClient(t).Get(ctx, client.ObjectKeyFromObject(job), &cur); err != nil {
		t.Fatalf("get Job %s: %v", job.Name, err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	change(&cur)
	return c.Patch(ctx, &cur, patch)
}

// wantDenied fails unless err is the policy's refusal and its message
// contains every one of want.
func wantDenied(t *testing.T, what string, err error, want []string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s was allowed; want it refused by ValidatingAdmissionPolicy %s", what, policyName)
	}
	if !deniedByPolicy(err) {
		t.Fatalf("%s was refused, but not by ValidatingAdmissionPolicy %s: %v", what, policyName, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: the refusal does not say %q:\n%v", what, w, err)
		}
	}
}

// TestTenantCannotBypassTheGate: once a Job is gated, a tenant with edit
// rights cannot undo the gate, and is told what is protected and what to do.
func TestTenantCannotBypassTheGate(t *testing.T) {
	tests := map[string]struct {
		// prepare changes the gated Job first, as the operator.
		prepare func(*batchv1.Job)
		// change is the tenant's attempt.
		change func(*batchv1.Job)
		want   []string
	}{
		"remove the lock label": {
			change: func(j *batchv1.Job) { delete(j.Labels, locksv1alpha1.LabelLock) },
			want:   []string{"the label lockwarden.io/lock", "only lockwarden", "delete it"},
		},
		"change the lock label": {
			change: func(j *batchv1.Job) { j.Labels[locksv1alpha1.LabelLock] = "another-lock" },
			want:   []string{"the label lockwarden.io/lock", "only lockwarden"},
		},
		"remove the lock annotation": {
			change: func(j *batchv1.Job) { delete(j.Annotations, locksv1alpha1.AnnotationLock) },
			want:   []string{"the annotation lockwarden.io/lock of Job", "only lockwarden", "create a new Job"},
		},
		"set the contention": {
			change: func(j *batchv1.Job) {
				j.Annotations[locksv1alpha1.AnnotationContention] = string(locksv1alpha1.ContentionSkip)
			},
			want: []string{"the annotation lockwarden.io/contention", "only lockwarden"},
		},
		"add lockwarden.io/lost": {
			change: func(j *batchv1.Job) { j.Annotations[locksv1alpha1.AnnotationLost] = "forged" },
			want:   []string{"the annotation lockwarden.io/lost", "only lockwarden", "delete it"},
		},
		"add lockwarden.io/skipped": {
			change: func(j *batchv1.Job) { j.Annotations[locksv1alpha1.AnnotationSkipped] = "forged" },
			want:   []string{"the annotation lockwarden.io/skipped", "only lockwarden"},
		},
		"extend the maximum wait": {
			change: func(j *batchv1.Job) { j.Annotations[locksv1alpha1.AnnotationMaxWait] = "720h" },
			want:   []string{"the annotation lockwarden.io/max-wait", "only lockwarden"},
		},
		"forge a place in the queue": {
			change: func(j *batchv1.Job) { j.Annotations[locksv1alpha1.AnnotationQueuePosition] = "1/9" },
			want:   []string{"the annotation lockwarden.io/queue-position", "only lockwarden"},
		},
		"forge whom it waits for": {
			change: func(j *batchv1.Job) { j.Annotations[locksv1alpha1.AnnotationWaitingFor] = "nobody" },
			want:   []string{"the annotation lockwarden.io/waiting-for", "only lockwarden"},
		},
		"forge a fencing token on the Job": {
			change: func(j *batchv1.Job) { j.Annotations[locksv1alpha1.AnnotationFencingToken] = "999" },
			want:   []string{"the annotation lockwarden.io/fencing-token of Job", "only lockwarden"},
		},
		"edit the fencing token on the Job": {
			prepare: holdLock("7", false),
			change:  func(j *batchv1.Job) { j.Annotations[locksv1alpha1.AnnotationFencingToken] = "8" },
			want:    []string{"the annotation lockwarden.io/fencing-token of Job", "only lockwarden"},
		},
		"edit the fencing token and holder on the Job": {
			prepare: holdLock("7", false),
			change: func(j *batchv1.Job) {
				j.Annotations[locksv1alpha1.AnnotationFencingToken] = "8"
				delete(j.Annotations, locksv1alpha1.AnnotationHolder)
			},
			want: []string{"the annotations lockwarden.io/fencing-token, lockwarden.io/holder of Job", "are protected"},
		},
		"edit the fencing token on the pod template while suspended": {
			prepare: holdLock("7", false),
			change: func(j *batchv1.Job) {
				j.Spec.Template.Annotations[locksv1alpha1.AnnotationFencingToken] = "8"
			},
			want: []string{"the pod template annotation lockwarden.io/fencing-token", "spec.template.metadata.annotations", "only lockwarden"},
		},
		"forge a fencing token on the pod template while suspended": {
			change: func(j *batchv1.Job) {
				j.Spec.Template.Annotations = map[string]string{locksv1alpha1.AnnotationFencingToken: "999"}
			},
			want: []string{"the pod template annotation lockwarden.io/fencing-token", "only lockwarden"},
		},
		"remove the finalizer": {
			change: func(j *batchv1.Job) {
				j.Finalizers = slices.DeleteFunc(j.Finalizers, func(f string) bool { return f == locksv1alpha1.Finalizer })
			},
			want: []string{"the finalizer locks.lockwarden.io/release", "only lockwarden", "delete it"},
		},
		"unsuspend": {
			change: func(j *batchv1.Job) { j.Spec.Suspend = new(false) },
			want:   []string{"is gated by the lock " + testLock, "spec.suspend is protected", "only lockwarden", "delete the Job"},
		},
		// The API server reports the first refusal only.
		"unsuspend without the label": {
			change: func(j *batchv1.Job) {
				delete(j.Labels, locksv1alpha1.LabelLock)
				j.Spec.Suspend = new(false)
			},
			want: []string{"the label lockwarden.io/lock", "only lockwarden"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			job := createGatedJob(t, tenantNamespace, testLock)
			if tc.prepare != nil {
				if err := patchJob(t, operatorClient(t), job, tc.prepare); err != nil {
					t.Fatalf("prepare the Job as the operator: %v", err)
				}
			}
			wantDenied(t, "the tenant's attempt to "+name, patchJob(t, tenantClient(t), job, tc.change), tc.want)
		})
	}
}

// TestOnlyTheOperatorIsExempt: cluster administrators are refused too; the
// policy lets only lockwarden's ServiceAccount through.
func TestOnlyTheOperatorIsExempt(t *testing.T) {
	job := createGatedJob(t, tenantNamespace, testLock)
	err := patchJob(t, adminClient(t), job, func(j *batchv1.Job) { j.Spec.Suspend = new(false) })
	wantDenied(t, "an administrator's unsuspending a gated Job", err, []string{"spec.suspend is protected"})
}

// TestOperatorChangesTheGate: what lockwarden does to a gated Job passes.
func TestOperatorChangesTheGate(t *testing.T) {
	job := createGatedJob(t, tenantNamespace, testLock)
	op := operatorClient(t)
	if err := patchJob(t, op, job, holdLock("1", true)); err != nil {
		t.Fatalf("the operator could not write the fencing token and holder on the Job and its pod template and unsuspend it in one patch: %v", err)
	}
	if err := patchJob(t, op, job, func(j *batchv1.Job) {
		j.Annotations[locksv1alpha1.AnnotationLost] = "lease expired"
	}); err != nil {
		t.Fatalf("the operator could not mark the Job lost: %v", err)
	}
	if err := patchJob(t, op, job, func(j *batchv1.Job) {
		j.Finalizers = slices.DeleteFunc(j.Finalizers, func(f string) bool { return f == locksv1alpha1.Finalizer })
	}); err != nil {
		t.Fatalf("the operator could not remove the finalizer: %v", err)
	}
	var got batchv1.Job
	if err := op.Get(context.Background(), client.ObjectKeyFromObject(job), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Suspend == nil || *got.Spec.Suspend || got.Spec.Template.Annotations[locksv1alpha1.AnnotationFencingToken] != "1" || slices.Contains(got.Finalizers, locksv1alpha1.Finalizer) {
		t.Errorf("the operator's changes did not all land: suspend=%v, template annotations=%v, finalizers=%v",
			got.Spec.Suspend, got.Spec.Template.Annotations, got.Finalizers)
	}
}

// TestTenantOrdinaryEdits: the policy refuses only the gate's fields; a
// tenant keeps editing its Jobs otherwise, and can always delete them.
func TestTenantOrdinaryEdits(t *testing.T) {
	tenant := tenantClient(t)
	ctx := context.Background()

	t.Run("own label and annotation on a gated Job", func(t *testing.T) {
		job := createGatedJob(t, tenantNamespace, testLock)
		if err := patchJob(t, tenant, job, func(j *batchv1.Job) {
			j.Labels["team"] = "a"
			j.Annotations["example.com/owner"] = "tenant"
			j.Spec.Template.Annotations = map[string]string{"example.com/trace": "on"}
		}); err != nil {
			t.Fatalf("the tenant could not label and annotate its gated Job: %v", err)
		}
	})

	t.Run("label a Job with no labels or annotations", func(t *testing.T) {
		// The policy reads maps that are missing here.
		job := newJob("plain", tenantNamespace).Obj()
		if err := tenant.Create(ctx, job); err != nil {
			t.Fatalf("the tenant could not create an ungated Job: %v", err)
		}
		t.Cleanup(func() { removeJob(t, job) })
		if err := patchJob(t, tenant, job, func(j *batchv1.Job) {
			j.Labels["team"] = "a"
			j.Spec.Suspend = new(true)
		}); err != nil {
			t.Fatalf("the tenant could not edit its ungated Job: %v", err)
		}
		if err := patchJob(t, tenant, job, func(j *batchv1.Job) { j.Spec.Suspend = new(false) }); err != nil {
			t.Fatalf("the tenant could not unsuspend its ungated Job: %v", err)
		}
	})

	t.Run("delete a gated Job", func(t *testing.T) {
		job := createGatedJob(t, tenantNamespace, testLock)
		if err := tenant.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
			t.Fatalf("the tenant could not delete its gated Job: %v", err)
		}
		var got batchv1.Job
		if err := tenant.Get(ctx, client.ObjectKeyFromObject(job), &got); err != nil {
			t.Fatal(err)
		}
		if got.DeletionTimestamp == nil || !slices.Contains(got.Finalizers, locksv1alpha1.Finalizer) {
			t.Fatalf("a deleted gated Job should wait for lockwarden's finalizer: deletionTimestamp=%v finalizers=%v", got.DeletionTimestamp, got.Finalizers)
		}
		// Still lockwarden's to let go of.
		err := patchJob(t, tenant, job, func(j *batchv1.Job) { j.Finalizers = nil })
		wantDenied(t, "the tenant's removing the finalizer of a deleted Job", err, []string{"the finalizer locks.lockwarden.io/release"})
	})
}

// TestCreate: a tenant cannot create a Job that looks gated without being
// gated as lockwarden's webhook does it, nor one that claims to hold a lock.
// No webhook runs here: the Jobs reach the policy as the tenant wrote them.
func TestCreate(t *testing.T) {
	tests := map[string]struct {
		job  *batchv1.Job
		want []string // nil: allowed
	}{
		"an ungated Job": {
			job: newJob("", tenantNamespace).Label("team", "a").Annotation("example.com/owner", "tenant").Obj(),
		},
		"a Job as the webhook gates it": {
			job: newJob("", tenantNamespace).Gated(testLock).Obj(),
		},
		"the lock label without the annotation": {
			job:  newJob("", tenantNamespace).Label(locksv1alpha1.LabelLock, testLock).Finalizer(locksv1alpha1.Finalizer).Suspend(true).Obj(),
			want: []string{"the label lockwarden.io/lock is reserved", "set only the annotation lockwarden.io/lock"},
		},
		"the lock label naming another lock than the annotation": {
			job:  newJob("", tenantNamespace).Gated(testLock).Label(locksv1alpha1.LabelLock, "another-lock").Obj(),
			want: []string{"the label lockwarden.io/lock is reserved"},
		},
		"the lock label, not suspended": {
			job:  newJob("", tenantNamespace).Gated(testLock).Suspend(false).Obj(),
			want: []string{"must be created suspended"},
		},
		"the lock label without the finalizer": {
			job:  newJob("", tenantNamespace).Label(locksv1alpha1.LabelLock, testLock).Annotation(locksv1alpha1.AnnotationLock, testLock).Suspend(true).Obj(),
			want: []string{"finalizer locks.lockwarden.io/release"},
		},
		"a forged fencing token on the pod template": {
			job:  newJob("", tenantNamespace).Gated(testLock).TemplateAnnotation(locksv1alpha1.AnnotationFencingToken, "999").Obj(),
			want: []string{"may not carry spec.template.metadata.annotations[lockwarden.io/fencing-token]", "only lockwarden writes"},
		},
		"a forged fencing token and holder on the Job": {
			job: newJob("", tenantNamespace).Gated(testLock).
				Annotation(locksv1alpha1.AnnotationFencingToken, "999").Annotation(locksv1alpha1.AnnotationHolder, "me").Obj(),
			want: []string{"metadata.annotations[lockwarden.io/fencing-token], metadata.annotations[lockwarden.io/holder]"},
		},
		"a forged token on an ungated Job": {
			job:  newJob("", tenantNamespace).TemplateAnnotation(locksv1alpha1.AnnotationFencingToken, "999").Obj(),
			want: []string{"spec.template.metadata.annotations[lockwarden.io/fencing-token]"},
		},
		"lockwarden.io/lost": {
			job:  newJob("", tenantNamespace).Gated(testLock).Annotation(locksv1alpha1.AnnotationLost, "copied").Obj(),
			want: []string{"metadata.annotations[lockwarden.io/lost]", "Remove them"},
		},
		"the finalizer without the label": {
			job:  newJob("", tenantNamespace).Finalizer(locksv1alpha1.Finalizer).Obj(),
			want: []string{"the finalizer locks.lockwarden.io/release is reserved", "nothing would remove it"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			job := tc.job
			job.GenerateName = "create-"
			err := tenantClient(t).Create(context.Background(), job)
			if err == nil {
				t.Cleanup(func() { removeJob(t, job) })
			}
			if tc.want == nil {
				if err != nil {
					t.Fatalf("the tenant could not create %s: %v", name, err)
				}
				return
			}
			wantDenied(t, "the tenant's creating "+name, err, tc.want)
		})
	}
}

// TestLargeJobs: the policy's cost stays within the API server's CEL limits
// for Jobs with thousands of annotations and many finalizers: its rules look
// up the protected names, never walk the annotation maps.
func TestLargeJobs(t *testing.T) {
	ctx := context.Background()
	tenant := tenantClient(t)
	b := newJob("", tenantNamespace).Gated(testLock)
	for i := range 2000 {
		k := fmt.Sprintf("example.com/a%04d", i)
		b.Annotation(k, "v").TemplateAnnotation(k, "v")
	}
	for i := range 100 {
		b.Finalizer(fmt.Sprintf("example.com/f%03d", i))
	}
	job := b.Obj()
	job.GenerateName = "large-"
	if err := tenant.Create(ctx, job); err != nil {
		t.Fatalf("the tenant could not create a gated Job with 4000 annotations and 101 finalizers: %v", err)
	}
	t.Cleanup(func() { removeJob(t, job) })
	t.Cleanup(func() {
		// The tenant's own finalizers, before removeJob removes lockwarden's.
		if err := patchJob(t, tenant, job, func(j *batchv1.Job) { j.Finalizers = []string{locksv1alpha1.Finalizer} }); err != nil {
			t.Errorf("remove the tenant's finalizers: %v", err)
		}
	})
	if err := patchJob(t, tenant, job, func(j *batchv1.Job) { j.Annotations["example.com/a0000"] = "changed" }); err != nil {
		t.Fatalf("the tenant could not change its own annotation of a large Job: %v", err)
	}
	err := patchJob(t, tenant, job, func(j *batchv1.Job) { j.Annotations[locksv1alpha1.AnnotationLost] = "forged" })
	wantDenied(t, "the tenant's adding lockwarden.io/lost to a large Job", err, []string{"the annotation lockwarden.io/lost"})
}

// TestEveryNamespace: the policy binds in every namespace, not only in
// tenantNamespace; and the tenant's rights end at its namespaces (RBAC, not
// the policy, refuses it elsewhere).
func TestEveryNamespace(t *testing.T) {
	ns := newNamespace(t)
	err := tenantClient(t).Create(context.Background(), newJob("elsewhere", ns).Obj())
	if !apierrors.IsForbidden(err) || deniedByPolicy(err) {
		t.Fatalf("the tenant created a Job in namespace %s, where it has no rights, or was refused for another reason: %v", ns, err)
	}
	grantTenant(t, ns)
	job := createGatedJob(t, ns, testLock)
	err = patchJob(t, tenantClient(t), job, func(j *batchv1.Job) { j.Spec.Suspend = new(false) })
	wantDenied(t, "the tenant's unsuspending a gated Job in namespace "+ns, err, []string{"spec.suspend is protected"})
}
