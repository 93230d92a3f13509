package tenancy

import (
	"context"
	"sync"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/tenancytest"
)

// kueueUser is the username of Kueue's controller in its default
// installation: the policy's variables.kueueUser.
const kueueUser = "system:serviceaccount:kueue-system:kueue-controller-manager"

// queueLabel is the label that hands a Job to Kueue.
const queueLabel = "kueue.x-k8s.io/queue-name"

var (
	kueueOnce   sync.Once
	asKueue     client.Client
	asKueueFail error
)

// kueueClient returns a direct client acting as Kueue's controller, with
// the edit rights of the tenant's group in tenantNamespace (in a cluster
// Kueue's own ClusterRole; the policy looks only at the username).
func kueueClient(t testing.TB) client.Client {
	t.Helper()
	needEnv(t)
	kueueOnce.Do(func() {
		_, asKueue, asKueueFail = tenancytest.User(env, kueueUser, "system:serviceaccounts", tenantGroup)
	})
	if asKueueFail != nil {
		t.Fatal(asKueueFail)
	}
	return asKueue
}

// Queued makes the Job look as it reaches the API server when it names a
// lock and Kueue queues it: lockwarden's webhook leaves it ungated (no
// label, no finalizer), Kueue's suspends it.
func (b *jobBuilder) Queued(lock string) *jobBuilder {
	return b.Label(queueLabel, "team-a").Annotation(locksv1alpha1.AnnotationLock, lock).Suspend(true)
}

// createQueuedJob creates, as the tenant, a Job that names lock and that
// Kueue queues, and deletes it when the test ends.
func createQueuedJob(t testing.TB) *batchv1.Job {
	t.Helper()
	job := newJob("", tenantNamespace).Queued(testLock).Obj()
	job.GenerateName = "queued-"
	if err := tenantClient(t).Create(context.Background(), job); err != nil {
		t.Fatalf("the tenant could not create a Job that names a lock and is queued by Kueue: %v", err)
	}
	t.Cleanup(func() { removeJob(t, job) })
	return job
}

// kueueStarts is what Kueue writes when it starts a Job whose Workload was
// admitted: the pod set updates of the admission checks (here lockwarden's
// fencing token and holder) on the pod template, and spec.suspend false.
func kueueStarts(token string) func(*batchv1.Job) {
	return func(j *batchv1.Job) {
		if j.Spec.Template.Annotations == nil {
			j.Spec.Template.Annotations = map[string]string{}
		}
		j.Spec.Template.Annotations[locksv1alpha1.AnnotationFencingToken] = token
		j.Spec.Template.Annotations[locksv1alpha1.AnnotationHolder] = "default/" + j.Namespace + "/Workload/job-" + j.Name
		j.Spec.Suspend = new(false)
	}
}

// kueueStops is Kueue's first step when it evicts a Workload: it suspends
// its Job (the API server lets the pod template change only then).
func kueueStops(j *batchv1.Job) { j.Spec.Suspend = new(true) }

// kueueRestores is its second: it takes the admission checks' pod set
// updates back out of the suspended Job's pod template.
func kueueRestores(j *batchv1.Job) {
	delete(j.Spec.Template.Annotations, locksv1alpha1.AnnotationFencingToken)
	delete(j.Spec.Template.Annotations, locksv1alpha1.AnnotationHolder)
}

// TestKueueStartsAndStopsQueuedJobs: Kueue's controller starts a Job that
// names a lock with the token lockwarden's admission check gave it, and
// stops it again (eviction) taking the token back, though neither is
// lockwarden's identity.
func TestKueueStartsAndStopsQueuedJobs(t *testing.T) {
	job := createQueuedJob(t)
	kq := kueueClient(t)
	if err := patchJob(t, kq, job, kueueStarts("42")); err != nil {
		t.Fatalf("Kueue could not start the Job with lockwarden's fencing token in its pod template: %v", err)
	}
	if err := patchJob(t, kq, job, kueueStops); err != nil {
		t.Fatalf("Kueue could not stop the Job (eviction): %v", err)
	}
	if err := patchJob(t, kq, job, kueueRestores); err != nil {
		t.Fatalf("Kueue could not restore the pod template of the stopped Job (eviction): %v", err)
	}
	if err := patchJob(t, kq, job, kueueStarts("43")); err != nil {
		t.Fatalf("Kueue could not start the Job again with a new token after the eviction: %v", err)
	}
	var got batchv1.Job
	if err := adminClient(t).Get(context.Background(), client.ObjectKeyFromObject(job), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Suspend == nil || *got.Spec.Suspend || got.Spec.Template.Annotations[locksv1alpha1.AnnotationFencingToken] != "43" {
		t.Errorf("Kueue's changes did not land: suspend=%v, template annotations=%v", got.Spec.Suspend, got.Spec.Template.Annotations)
	}
}

// TestQueuedJobsCannotRunWithoutTheLock: nobody but Kueue starts a queued
// Job that names a lock, Kueue only with a fencing token, and nobody but
// Kueue writes that token: a tenant cannot forge one and get it run.
func TestQueuedJobsCannotRunWithoutTheLock(t *testing.T) {
	tests := map[string]struct {
		as     func(testing.TB) client.Client
		change func(*batchv1.Job)
		want   []string
	}{
		"the tenant unsuspends it": {
			as:     tenantClient,
			change: func(j *batchv1.Job) { j.Spec.Suspend = new(false) },
			want:   []string{"is queued by Kueue: only Kueue starts it"},
		},
		"the tenant forges a fencing token and starts it (Kueue's own change, made by another user)": {
			as:     tenantClient,
			change: kueueStarts("999999"),
			want:   []string{"lockwarden.io/fencing-token", "protected"},
		},
		"the tenant forges a fencing token on the suspended Job, for Kueue to start it with": {
			as: tenantClient,
			change: func(j *batchv1.Job) {
				j.Spec.Template.Annotations = map[string]string{locksv1alpha1.AnnotationFencingToken: "999999"}
			},
			want: []string{"pod template annotation lockwarden.io/fencing-token", "protected"},
		},
		"the tenant removes the queue name, to start it outside Kueue": {
			as:     tenantClient,
			change: func(j *batchv1.Job) { delete(j.Labels, queueLabel) },
			want:   []string{"kueue.x-k8s.io/queue-name", "may be changed but not removed"},
		},
		"the tenant removes the lock": {
			as:     tenantClient,
			change: func(j *batchv1.Job) { delete(j.Annotations, locksv1alpha1.AnnotationLock) },
			want:   []string{"the annotation lockwarden.io/lock of Job", "only lockwarden"},
		},
		"an administrator unsuspends it": {
			as:     adminClient,
			change: func(j *batchv1.Job) { j.Spec.Suspend = new(false) },
			want:   []string{"only Kueue starts it"},
		},
		"Kueue starts it without a token (its ClusterQueue lacks lockwarden's admission check)": {
			as:     kueueClient,
			change: func(j *batchv1.Job) { j.Spec.Suspend = new(false) },
			want:   []string{"add an AdmissionCheck of controllerName lockwarden.io/lock to the ClusterQueue"},
		},
		"Kueue writes another lockwarden annotation on the pod template": {
			as: kueueClient,
			change: func(j *batchv1.Job) {
				j.Spec.Template.Annotations = map[string]string{locksv1alpha1.AnnotationLost: "forged"}
			},
			want: []string{"pod template annotation lockwarden.io/lost", "protected"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			job := createQueuedJob(t)
			err := patchJob(t, tc.as(t), job, tc.change)
			wantDenied(t, name, err, tc.want)
		})
	}

	t.Run("the tenant changes the token of a Job Kueue stopped", func(t *testing.T) {
		job := createQueuedJob(t)
		if err := patchJob(t, kueueClient(t), job, kueueStarts("42")); err != nil {
			t.Fatalf("Kueue could not start the Job: %v", err)
		}
		if err := patchJob(t, kueueClient(t), job, kueueStops); err != nil {
			t.Fatalf("Kueue could not stop the Job: %v", err)
		}
		err := patchJob(t, tenantClient(t), job, func(j *batchv1.Job) {
			j.Spec.Template.Annotations[locksv1alpha1.AnnotationFencingToken] = "999999"
		})
		wantDenied(t, "the tenant's changing the token of a stopped queued Job", err, []string{"pod template annotation lockwarden.io/fencing-token", "protected"})
	})
}

// TestCreateQueuedJobs: a Job that names a lock and that Kueue queues (or
// that another controller manages) is created suspended and holding no
// token; anything else is refused.
func TestCreateQueuedJobs(t *testing.T) {
	managedBy := func(b *jobBuilder, m string) *jobBuilder { b.job.Spec.ManagedBy = &m; return b }
	tests := map[string]struct {
		job  *batchv1.Job
		want []string // nil: allowed
	}{
		"queued and suspended": {
			job: newJob("", tenantNamespace).Queued(testLock).Obj(),
		},
		"queued by annotation and suspended": {
			job: newJob("", tenantNamespace).Annotation(queueLabel, "team-a").Annotation(locksv1alpha1.AnnotationLock, testLock).Suspend(true).Obj(),
		},
		"queued but not suspended (Kueue's webhook did not run)": {
			job:  newJob("", tenantNamespace).Queued(testLock).Suspend(false).Obj(),
			want: []string{"must be created suspended", "Is Kueue installed"},
		},
		"managed by MultiKueue, not suspended": {
			job:  managedBy(newJob("", tenantNamespace).Annotation(locksv1alpha1.AnnotationLock, testLock), "kueue.x-k8s.io/multikueue").Obj(),
			want: []string{"must be created suspended"},
		},
		"queued with a forged fencing token on the pod template": {
			job:  newJob("", tenantNamespace).Queued(testLock).TemplateAnnotation(locksv1alpha1.AnnotationFencingToken, "999999").Obj(),
			want: []string{"may not carry spec.template.metadata.annotations[lockwarden.io/fencing-token]"},
		},
		"queued, naming no lock, not suspended": {
			job: newJob("", tenantNamespace).Label(queueLabel, "team-a").Obj(),
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
					t.Fatalf("the tenant could not create a Job %s: %v", name, err)
				}
				return
			}
			wantDenied(t, "the tenant's creating a Job "+name, err, tc.want)
		})
	}
}
