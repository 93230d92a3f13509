package webhook

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/netguard"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

// jobWrapper builds Jobs for tests: makeJob("j").Annotation(k, v).Obj().
type jobWrapper struct{ batchv1.Job }

func makeJob(name string) *jobWrapper {
	return &jobWrapper{batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}}
}

func (j *jobWrapper) Obj() *batchv1.Job { return j.DeepCopy() }

func (j *jobWrapper) Annotation(k, v string) *jobWrapper {
	if j.Annotations == nil {
		j.Annotations = map[string]string{}
	}
	j.Annotations[k] = v
	return j
}

func (j *jobWrapper) Label(k, v string) *jobWrapper {
	if j.Labels == nil {
		j.Labels = map[string]string{}
	}
	j.Labels[k] = v
	return j
}

func (j *jobWrapper) TemplateAnnotation(k, v string) *jobWrapper {
	if j.Spec.Template.Annotations == nil {
		j.Spec.Template.Annotations = map[string]string{}
	}
	j.Spec.Template.Annotations[k] = v
	return j
}

func (j *jobWrapper) Suspend(s bool) *jobWrapper {
	j.Spec.Suspend = &s
	return j
}

func (j *jobWrapper) Finalizer(f string) *jobWrapper {
	j.Finalizers = append(j.Finalizers, f)
	return j
}

func (j *jobWrapper) Container(name string, env ...corev1.EnvVar) *jobWrapper {
	j.Spec.Template.Spec.Containers = append(j.Spec.Template.Spec.Containers, corev1.Container{Name: name, Image: "busybox", Env: env})
	return j
}

func (j *jobWrapper) InitContainer(name string, env ...corev1.EnvVar) *jobWrapper {
	j.Spec.Template.Spec.InitContainers = append(j.Spec.Template.Spec.InitContainers, corev1.Container{Name: name, Image: "busybox", Env: env})
	return j
}

// OwnedBy adds an owner reference to the CronJob name with uid.
func (j *jobWrapper) OwnedBy(name string, uid types.UID, controller bool) *jobWrapper {
	j.OwnerReferences = append(j.OwnerReferences, metav1.OwnerReference{APIVersion: "batch/v1", Kind: "CronJob", Name: name, UID: uid, Controller: &controller})
	return j
}

// GatedBy adds what the gate adds to a Job for lock, as a user sees it.
func (j *jobWrapper) GatedBy(lock, contention string) *jobWrapper {
	j.Label(locksv1alpha1.LabelLock, lock).Annotation(locksv1alpha1.AnnotationLock, lock).Suspend(true).Finalizer(locksv1alpha1.Finalizer)
	if contention != "" {
		j.Annotation(locksv1alpha1.AnnotationContention, contention)
	}
	return j
}

func env(name, value string) corev1.EnvVar { return corev1.EnvVar{Name: name, Value: value} }

// gateEnv is what every container of a Job gated by lock gets, written out
// as the contract users read: the downward API paths of the token and holder.
func gateEnv(lock string) []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: "LOCKWARDEN_FENCING_TOKEN", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['lockwarden.io/fencing-token']"}}},
		{Name: "LOCKWARDEN_HOLDER", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['lockwarden.io/holder']"}}},
		{Name: "LOCKWARDEN_LOCK", Value: lock},
	}
}

func TestGate(t *testing.T) {
	t.Parallel()
	cases := map[string]struct {
		job        *batchv1.Job
		lock       string
		contention string
		want       *batchv1.Job
	}{
		"suspended, labelled, finalized, with the lock's variables": {
			job:  makeJob("j").Container("main").Obj(),
			lock: "billing",
			want: makeJob("j").GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"contention recorded": {
			job:        makeJob("j").Container("main").Obj(),
			lock:       "billing",
			contention: "Skip",
			want:       makeJob("j").GatedBy("billing", "Skip").Container("main", gateEnv("billing")...).Obj(),
		},
		"a Job the user left unsuspended is suspended": {
			job:  makeJob("j").Suspend(false).Container("main").Obj(),
			lock: "billing",
			want: makeJob("j").GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"the user's labels, annotations and finalizers are kept": {
			job: makeJob("j").Label("team", "payments").Annotation("owner", "ops").Finalizer("example.com/keep").
				TemplateAnnotation("prometheus.io/scrape", "true").Container("main").Obj(),
			lock: "billing",
			want: makeJob("j").Label("team", "payments").Annotation("owner", "ops").Finalizer("example.com/keep").
				TemplateAnnotation("prometheus.io/scrape", "true").GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"a fencing token, holder, lost or skipped mark, or queue place the user wrote is removed": {
			job: makeJob("j").
				Annotation(locksv1alpha1.AnnotationFencingToken, "999999").Annotation(locksv1alpha1.AnnotationHolder, "me").
				Annotation(locksv1alpha1.AnnotationQueuePosition, "1/1").Annotation(locksv1alpha1.AnnotationWaitingFor, "nobody").
				Annotation(locksv1alpha1.AnnotationLost, "forged").Annotation(locksv1alpha1.AnnotationSkipped, "forged").
				TemplateAnnotation(locksv1alpha1.AnnotationLost, "forged").
				TemplateAnnotation(locksv1alpha1.AnnotationFencingToken, "999999").TemplateAnnotation(locksv1alpha1.AnnotationHolder, "me").
				TemplateAnnotation("keep", "yes").Container("main").Obj(),
			lock: "billing",
			want: makeJob("j").TemplateAnnotation("keep", "yes").GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"every container and init container, same-named variables replaced": {
			job: makeJob("j").
				InitContainer("migrate", env("LOCKWARDEN_LOCK", "forged")).
				Container("main", env("FOO", "bar"), env("LOCKWARDEN_FENCING_TOKEN", "999999")).
				Container("sidecar").Obj(),
			lock: "billing",
			want: makeJob("j").GatedBy("billing", "").
				InitContainer("migrate", gateEnv("billing")...).
				Container("main", append([]corev1.EnvVar{env("FOO", "bar")}, gateEnv("billing")...)...).
				Container("sidecar", gateEnv("billing")...).Obj(),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := tc.job.DeepCopy()
			Gate(got, tc.lock, tc.contention)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("gated Job (-want,+got):\n%s", diff)
			}
			Gate(got, tc.lock, tc.contention)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Job gated twice (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestValidateAnnotations(t *testing.T) {
	t.Parallel()
	lockField := "metadata.annotations[lockwarden.io/lock]"
	contentionField := "metadata.annotations[lockwarden.io/contention]"
	cases := map[string]struct {
		lock, contention, source string
		wantFields               []string
		wantText                 []string // substrings of the error messages
	}{
		"lock only":                   {lock: "billing"},
		"lock with dots":              {lock: "billing.ledger-2"},
		"contention Queue":            {lock: "billing", contention: "Queue"},
		"contention Skip":             {lock: "billing", contention: "Skip"},
		"contention QueueLatest":      {lock: "billing", contention: "QueueLatest"},
		"contention ReplaceQueued":    {lock: "billing", contention: "ReplaceQueued"},
		"contention CancelInProgress": {lock: "billing", contention: "CancelInProgress"},
		"empty lock name":             {lock: "", wantFields: []string{lockField}, wantText: []string{"must name a DistributedLock"}},
		"upper case lock name":        {lock: "Billing", wantFields: []string{lockField}, wantText: []string{`"Billing"`, "lowercase"}},
		"lock name with a slash":      {lock: "team/billing", wantFields: []string{lockField}},
		"lock name of 254 letters":    {lock: strings.Repeat("a", 254), wantFields: []string{lockField}},
		"lock name of 63 letters":     {lock: strings.Repeat("a", 63)},
		"lock name of 64 letters":     {lock: strings.Repeat("a", 64), wantFields: []string{lockField}, wantText: []string{"at most 63 characters", "label value"}},
		"lower case contention":       {lock: "billing", contention: "queue", wantFields: []string{contentionField}, wantText: []string{`"queue"`, `"Queue"`, `"Skip"`}},
		"unknown contention":          {lock: "billing", contention: "Wait", wantFields: []string{contentionField}, wantText: []string{`"Queue" (wait in FIFO order)`, `"QueueLatest"`, `"ReplaceQueued"`, `"CancelInProgress"`, `"Skip"`, "spec.contention"}},
		"both wrong":                  {lock: "Billing", contention: "Wait", wantFields: []string{lockField, contentionField}},
		"the CronJob is named":        {lock: "Billing", source: "on CronJob nightly: ", wantFields: []string{lockField}, wantText: []string{"on CronJob nightly: must name"}},
		"the CronJob is named, too":   {lock: "billing", contention: "Wait", source: "on CronJob nightly: ", wantFields: []string{contentionField}, wantText: []string{"on CronJob nightly: must be"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			errs := validateAnnotations(tc.lock, tc.contention, field.NewPath("metadata", "annotations"), tc.source)
			var fields []string
			for _, e := range errs {
				fields = append(fields, e.Field)
			}
			if diff := cmp.Diff(tc.wantFields, fields); diff != "" {
				t.Errorf("fields in error (-want,+got):\n%s", diff)
			}
			msg := errs.ToAggregate()
			for _, w := range tc.wantText {
				if msg == nil || !strings.Contains(msg.Error(), w) {
					t.Errorf("error %v does not contain %q", msg, w)
				}
			}
		})
	}
}

func TestDefault(t *testing.T) {
	t.Parallel()
	cronJob := func(name string, uid types.UID, annotations map[string]string) *batchv1.CronJob {
		return &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid, Annotations: annotations}}
	}
	dlock := func(namespace, name string) *locksv1alpha1.DistributedLock {
		return &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	}
	nightly := cronJob("nightly", "uid-nightly", map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationContention: "Skip"})
	lockField := "metadata.annotations[lockwarden.io/lock]"
	contentionField := "metadata.annotations[lockwarden.io/contention]"
	maxWaitField := "metadata.annotations[lockwarden.io/max-wait]"
	patient := cronJob("patient", "uid-patient", map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationMaxWait: "2h"})
	badWait := cronJob("impatient", "uid-impatient", map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationMaxWait: "soon"})
	semaphore := dlock("default", "exports")
	semaphore.Spec.MaxHolders = 3
	prioritized := dlock("default", "deploys")
	prioritized.Spec.Priority = &locksv1alpha1.Priority{MaxStarvationSeconds: 600, Highest: 1000}
	urgent := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "urgent"}, Value: 1000}
	priorityField := "metadata.annotations[lockwarden.io/priority]"
	weightField := "metadata.annotations[lockwarden.io/weight]"
	hotfix := cronJob("hotfix", "uid-hotfix", map[string]string{locksv1alpha1.AnnotationLock: "deploys", locksv1alpha1.AnnotationPriority: "900"})
	withClass := func(j *jobWrapper, class string) *jobWrapper {
		j.Spec.Template.Spec.PriorityClassName = class
		return j
	}

	cases := map[string]struct {
		cached   []client.Object // in Reader (the cache) and APIReader
		apiOnly  []client.Object // in APIReader only: created a moment ago
		job      *batchv1.Job
		want     *batchv1.Job // nil: the Job is left as it came
		wantErr  []string     // fields of an Invalid error
		wantText []string     // substrings of its message
	}{
		"a Job that names a lock is gated": {
			cached: []client.Object{dlock("default", "billing")},
			job:    makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Container("main").Obj(),
			want:   makeJob("j").GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"a Job's contention is kept": {
			cached: []client.Object{dlock("default", "billing")},
			job:    makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Annotation(locksv1alpha1.AnnotationContention, "Skip").Container("main").Obj(),
			want:   makeJob("j").GatedBy("billing", "Skip").Container("main", gateEnv("billing")...).Obj(),
		},
		"a Job of an annotated CronJob is gated with the CronJob's lock and contention": {
			cached: []client.Object{dlock("default", "billing"), nightly},
			job:    makeJob("nightly-1").OwnedBy("nightly", "uid-nightly", true).Container("main").Obj(),
			want:   makeJob("nightly-1").OwnedBy("nightly", "uid-nightly", true).GatedBy("billing", "Skip").Container("main", gateEnv("billing")...).Obj(),
		},
		"a Job's own lock wins over its CronJob's": {
			cached: []client.Object{dlock("default", "billing"), dlock("default", "reports"), nightly},
			job:    makeJob("nightly-1").OwnedBy("nightly", "uid-nightly", true).Annotation(locksv1alpha1.AnnotationLock, "reports").Container("main").Obj(),
			want:   makeJob("nightly-1").OwnedBy("nightly", "uid-nightly", true).GatedBy("reports", "").Container("main", gateEnv("reports")...).Obj(),
		},
		"a lock the cache does not have yet is confirmed with the API server": {
			apiOnly: []client.Object{dlock("default", "billing")},
			job:     makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Container("main").Obj(),
			want:    makeJob("j").GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"a Job that names no lock is left alone": {
			cached: []client.Object{dlock("default", "billing")},
			job:    makeJob("j").Annotation("owner", "ops").Container("main", env("FOO", "bar")).Obj(),
		},
		"a CronJob of the same name that is not the owner (other UID) is ignored": {
			cached: []client.Object{dlock("default", "billing"), nightly},
			job:    makeJob("nightly-1").OwnedBy("nightly", "uid-of-a-deleted-cronjob", true).Container("main").Obj(),
		},
		"a CronJob that owns but does not control the Job is ignored": {
			cached: []client.Object{dlock("default", "billing"), nightly},
			job:    makeJob("nightly-1").OwnedBy("nightly", "uid-nightly", false).Container("main").Obj(),
		},
		"a CronJob that names no lock gates nothing": {
			cached: []client.Object{dlock("default", "billing"), cronJob("nightly", "uid-nightly", map[string]string{"owner": "ops"})},
			job:    makeJob("nightly-1").OwnedBy("nightly", "uid-nightly", true).Container("main").Obj(),
		},
		"a Job of a CronJob already deleted is left alone": {
			cached: []client.Object{dlock("default", "billing")},
			job:    makeJob("nightly-1").OwnedBy("nightly", "uid-nightly", true).Container("main").Obj(),
		},
		"a missing lock is refused naming the annotation": {
			job:      makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Container("main").Obj(),
			wantErr:  []string{lockField},
			wantText: []string{`no DistributedLock "billing" in namespace "default"`, "create it"},
		},
		"a lock in another namespace does not count": {
			cached:   []client.Object{dlock("payments", "billing")},
			job:      makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Container("main").Obj(),
			wantErr:  []string{lockField},
			wantText: []string{`no DistributedLock "billing" in namespace "default"`},
		},
		"a CronJob's missing lock is refused naming the CronJob": {
			cached:   []client.Object{nightly},
			job:      makeJob("nightly-1").OwnedBy("nightly", "uid-nightly", true).Container("main").Obj(),
			wantErr:  []string{lockField},
			wantText: []string{"on CronJob nightly: ", `no DistributedLock "billing"`},
		},
		"a bad contention is refused naming the annotation": {
			cached:   []client.Object{dlock("default", "billing")},
			job:      makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Annotation(locksv1alpha1.AnnotationContention, "skip").Container("main").Obj(),
			wantErr:  []string{contentionField},
			wantText: []string{`"Queue"`, `"Skip"`},
		},
		"a Job's max wait is kept": {
			cached: []client.Object{dlock("default", "billing")},
			job:    makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Annotation(locksv1alpha1.AnnotationMaxWait, "45m").Container("main").Obj(),
			want:   makeJob("j").Annotation(locksv1alpha1.AnnotationMaxWait, "45m").GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"a CronJob's max wait is copied onto its Job": {
			cached: []client.Object{dlock("default", "billing"), patient},
			job:    makeJob("patient-1").OwnedBy("patient", "uid-patient", true).Container("main").Obj(),
			want: makeJob("patient-1").OwnedBy("patient", "uid-patient", true).Annotation(locksv1alpha1.AnnotationMaxWait, "2h").
				GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"a CronJob's max wait also applies when the Job names the lock itself": {
			cached: []client.Object{dlock("default", "billing"), patient},
			job:    makeJob("patient-1").OwnedBy("patient", "uid-patient", true).Annotation(locksv1alpha1.AnnotationLock, "billing").Container("main").Obj(),
			want: makeJob("patient-1").OwnedBy("patient", "uid-patient", true).Annotation(locksv1alpha1.AnnotationMaxWait, "2h").
				GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"a Job's own max wait wins over its CronJob's": {
			cached: []client.Object{dlock("default", "billing"), patient},
			job:    makeJob("patient-1").OwnedBy("patient", "uid-patient", true).Annotation(locksv1alpha1.AnnotationMaxWait, "10m").Container("main").Obj(),
			want: makeJob("patient-1").OwnedBy("patient", "uid-patient", true).Annotation(locksv1alpha1.AnnotationMaxWait, "10m").
				GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"an unparsable max wait is refused naming the annotation and a valid value": {
			cached:   []client.Object{dlock("default", "billing")},
			job:      makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Annotation(locksv1alpha1.AnnotationMaxWait, "45 minutes").Container("main").Obj(),
			wantErr:  []string{maxWaitField},
			wantText: []string{`"45 minutes"`, "positive duration", `"45m"`},
		},
		"a max wait without a unit is refused": {
			cached:  []client.Object{dlock("default", "billing")},
			job:     makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Annotation(locksv1alpha1.AnnotationMaxWait, "45").Container("main").Obj(),
			wantErr: []string{maxWaitField},
		},
		"a zero max wait is refused": {
			cached:  []client.Object{dlock("default", "billing")},
			job:     makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Annotation(locksv1alpha1.AnnotationMaxWait, "0s").Container("main").Obj(),
			wantErr: []string{maxWaitField},
		},
		"a negative max wait is refused": {
			cached:  []client.Object{dlock("default", "billing")},
			job:     makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Annotation(locksv1alpha1.AnnotationMaxWait, "-5m").Container("main").Obj(),
			wantErr: []string{maxWaitField},
		},
		"an empty max wait is refused": {
			cached:  []client.Object{dlock("default", "billing")},
			job:     makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Annotation(locksv1alpha1.AnnotationMaxWait, "").Container("main").Obj(),
			wantErr: []string{maxWaitField},
		},
		"a CronJob's bad max wait is refused naming the CronJob": {
			cached:   []client.Object{dlock("default", "billing"), badWait},
			job:      makeJob("impatient-1").OwnedBy("impatient", "uid-impatient", true).Container("main").Obj(),
			wantErr:  []string{maxWaitField},
			wantText: []string{"on CronJob impatient: ", `"soon"`, `"45m"`},
		},
		"a Job's good max wait hides its CronJob's bad one": {
			cached: []client.Object{dlock("default", "billing"), badWait},
			job:    makeJob("impatient-1").OwnedBy("impatient", "uid-impatient", true).Annotation(locksv1alpha1.AnnotationMaxWait, "1h").Container("main").Obj(),
			want: makeJob("impatient-1").OwnedBy("impatient", "uid-impatient", true).Annotation(locksv1alpha1.AnnotationMaxWait, "1h").
				GatedBy("billing", "").Container("main", gateEnv("billing")...).Obj(),
		},
		"a Job with a max wait but no lock is left alone": {
			cached: []client.Object{dlock("default", "billing")},
			job:    makeJob("j").Annotation(locksv1alpha1.AnnotationMaxWait, "soon").Container("main").Obj(),
		},
		"contention QueueLatest is accepted": {
			cached: []client.Object{dlock("default", "billing")},
			job:    makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Annotation(locksv1alpha1.AnnotationContention, "QueueLatest").Container("main").Obj(),
			want:   makeJob("j").GatedBy("billing", "QueueLatest").Container("main", gateEnv("billing")...).Obj(),
		},
		"contention CancelInProgress on a lock of one holder is accepted": {
			cached: []client.Object{dlock("default", "billing")},
			job:    makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Annotation(locksv1alpha1.AnnotationContention, "CancelInProgress").Container("main").Obj(),
			want:   makeJob("j").GatedBy("billing", "CancelInProgress").Container("main", gateEnv("billing")...).Obj(),
		},
		"contention CancelInProgress on a semaphore is refused": {
			cached:   []client.Object{semaphore},
			job:      makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "exports").Annotation(locksv1alpha1.AnnotationContention, "CancelInProgress").Container("main").Obj(),
			wantErr:  []string{contentionField},
			wantText: []string{`"CancelInProgress" needs a lock with maxHolders 1`, "lock exports has maxHolders 3", `"ReplaceQueued"`},
		},
		"a Job's priority is kept": {
			cached: []client.Object{prioritized},
			job:    makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "deploys").Annotation(locksv1alpha1.AnnotationPriority, "-5").Container("main").Obj(),
			want:   makeJob("j").Annotation(locksv1alpha1.AnnotationPriority, "-5").GatedBy("deploys", "").Container("main", gateEnv("deploys")...).Obj(),
		},
		"a CronJob's priority is copied onto its Job": {
			cached: []client.Object{prioritized, hotfix},
			job:    makeJob("hotfix-1").OwnedBy("hotfix", "uid-hotfix", true).Container("main").Obj(),
			want: makeJob("hotfix-1").OwnedBy("hotfix", "uid-hotfix", true).Annotation(locksv1alpha1.AnnotationPriority, "900").
				GatedBy("deploys", "").Container("main", gateEnv("deploys")...).Obj(),
		},
		"a pod template's PriorityClass gives the priority on a lock with spec.priority": {
			cached: []client.Object{prioritized, urgent},
			job:    withClass(makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "deploys").Container("main"), "urgent").Obj(),
			want: withClass(makeJob("j").Annotation(locksv1alpha1.AnnotationPriority, "1000").GatedBy("deploys", "").
				Container("main", gateEnv("deploys")...), "urgent").Obj(),
		},
		"a Job's own priority wins over its PriorityClass": {
			cached: []client.Object{prioritized, urgent},
			job:    withClass(makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "deploys").Annotation(locksv1alpha1.AnnotationPriority, "1").Container("main"), "urgent").Obj(),
			want: withClass(makeJob("j").Annotation(locksv1alpha1.AnnotationPriority, "1").GatedBy("deploys", "").
				Container("main", gateEnv("deploys")...), "urgent").Obj(),
		},
		"a PriorityClass is not read for a lock without spec.priority": {
			cached: []client.Object{dlock("default", "billing")},
			job:    withClass(makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Container("main"), "urgent").Obj(),
			want:   withClass(makeJob("j").GatedBy("billing", "").Container("main", gateEnv("billing")...), "urgent").Obj(),
		},
		"a missing PriorityClass is refused naming the field": {
			cached:   []client.Object{prioritized},
			job:      withClass(makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "deploys").Container("main"), "urgent").Obj(),
			wantErr:  []string{"spec.template.spec.priorityClassName"},
			wantText: []string{`"urgent"`},
		},
		"a priority that is not an integer is refused naming the annotation": {
			cached:   []client.Object{prioritized},
			job:      makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "deploys").Annotation(locksv1alpha1.AnnotationPriority, "high").Container("main").Obj(),
			wantErr:  []string{priorityField},
			wantText: []string{`"high"`, "integer", "for example 100"},
		},
		"a priority past int32 is refused": {
			cached:  []client.Object{prioritized},
			job:     makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "deploys").Annotation(locksv1alpha1.AnnotationPriority, "3000000000").Container("main").Obj(),
			wantErr: []string{priorityField},
		},
		"a Job's weight is kept": {
			cached: []client.Object{semaphore},
			job:    makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "exports").Annotation(locksv1alpha1.AnnotationWeight, "3").Container("main").Obj(),
			want:   makeJob("j").Annotation(locksv1alpha1.AnnotationWeight, "3").GatedBy("exports", "").Container("main", gateEnv("exports")...).Obj(),
		},
		"a CronJob's weight is copied onto its Job": {
			cached: []client.Object{semaphore, cronJob("heavy", "uid-heavy", map[string]string{locksv1alpha1.AnnotationLock: "exports", locksv1alpha1.AnnotationWeight: "2"})},
			job:    makeJob("heavy-1").OwnedBy("heavy", "uid-heavy", true).Container("main").Obj(),
			want: makeJob("heavy-1").OwnedBy("heavy", "uid-heavy", true).Annotation(locksv1alpha1.AnnotationWeight, "2").
				GatedBy("exports", "").Container("main", gateEnv("exports")...).Obj(),
		},
		"a weight above the lock's maxHolders is refused naming the lock and its maxHolders": {
			cached:   []client.Object{semaphore},
			job:      makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "exports").Annotation(locksv1alpha1.AnnotationWeight, "4").Container("main").Obj(),
			wantErr:  []string{weightField},
			wantText: []string{"lock exports takes 1 to 3 slots", "maxHolders"},
		},
		"a weight of 2 on a mutex is refused": {
			cached:   []client.Object{dlock("default", "billing")},
			job:      makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "billing").Annotation(locksv1alpha1.AnnotationWeight, "2").Container("main").Obj(),
			wantErr:  []string{weightField},
			wantText: []string{"1 to 1 slots"},
		},
		"a weight that is not a positive integer is refused naming the annotation": {
			cached:   []client.Object{semaphore},
			job:      makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "exports").Annotation(locksv1alpha1.AnnotationWeight, "0").Container("main").Obj(),
			wantErr:  []string{weightField},
			wantText: []string{`"0"`, "integer from 1"},
		},
		"a bad lock name is refused naming the annotation": {
			job:     makeJob("j").Annotation(locksv1alpha1.AnnotationLock, "Billing").Container("main").Obj(),
			wantErr: []string{lockField},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cache := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).WithObjects(deepCopies(tc.cached)...).Build()
			api := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).WithObjects(deepCopies(append(tc.cached, tc.apiOnly...))...).Build()
			g := &JobGate{Reader: cache, APIReader: api}
			got := tc.job.DeepCopy()

			err := g.Default(t.Context(), got)

			if tc.wantErr != nil {
				if diff := cmp.Diff(tc.wantErr, invalidFields(t, err)); diff != "" {
					t.Errorf("fields of the Invalid error (-want,+got):\n%s", diff)
				}
				for _, w := range tc.wantText {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Default: %v", err)
			}
			want := tc.want
			if want == nil {
				want = tc.job
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Job after Default (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestDefaultFailsWhenTheCronJobCannotBeRead: a Job whose CronJob cannot be
// read is refused (the API server retries the create) rather than let through
// ungated.
func TestDefaultFailsWhenTheCronJobCannotBeRead(t *testing.T) {
	t.Parallel()
	unavailable := errors.New("cache not synced")
	g := failingGate(unavailable)
	job := makeJob("nightly-1").OwnedBy("nightly", "uid-nightly", true).Container("main").Obj()

	err := g.Default(t.Context(), job)

	if !errors.Is(err, unavailable) || !strings.Contains(err.Error(), "default/nightly") {
		t.Errorf("Default = %v, want an error naming the CronJob default/nightly and wrapping %q", err, unavailable)
	}
}

// A lock that cannot be read (not: does not exist) is a failure to retry,
// not a user error that tells them to create the lock.
func TestDefaultFailsWhenTheLockCannotBeRead(t *testing.T) {
	t.Parallel()
	unavailable := errors.New("cache not synced")
	g := failingGate(unavailable)
	job := makeJob("once").Container("main").Obj()
	job.Annotations = map[string]string{locksv1alpha1.AnnotationLock: "billing"}

	err := g.Default(t.Context(), job)

	if apierrors.IsInvalid(err) || !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "cache not synced") {
		t.Errorf("Default = %v, want an internal (retryable) error saying why the lock could not be read", err)
	}
}

// failingGate is a gate whose every read fails with err.
func failingGate(err error) *JobGate {
	cache := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return err
		},
	}).Build()
	return &JobGate{Reader: cache, APIReader: cache}
}

func deepCopies(objs []client.Object) []client.Object {
	out := make([]client.Object, len(objs))
	for i, o := range objs {
		out[i] = o.DeepCopyObject().(client.Object)
	}
	return out
}

// invalidFields returns the fields an Invalid error names.
func invalidFields(t *testing.T, err error) []string {
	t.Helper()
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error = %v, want Invalid", err)
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		t.Fatalf("error %v has no details", err)
	}
	var fields []string
	for _, c := range status.Status().Details.Causes {
		fields = append(fields, c.Field)
	}
	return fields
}

// TestDefaultAppliesTheBackendPolicy: a Job whose lock may not use its
// backend or scope is refused at creation, with the reason the controllers
// would give, by the same decision (the registry's Check).
func TestDefaultAppliesTheBackendPolicy(t *testing.T) {
	t.Parallel()
	loopbackDenied, err := netguard.NewEndpointPolicy(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	lock := func(name string, scope locksv1alpha1.Scope, endpoint string) *locksv1alpha1.DistributedLock {
		return &locksv1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: locksv1alpha1.DistributedLockSpec{Keys: []string{"k"}, Scope: scope,
				Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{endpoint}}}},
		}
	}
	cases := map[string]struct {
		lock     *locksv1alpha1.DistributedLock
		wantText []string // empty: gated
	}{
		"an allowed lock":                      {lock: lock("ok", locksv1alpha1.ScopeNamespace, "redis.infra:6379")},
		"scope Global where it is not allowed": {lock: lock("global", locksv1alpha1.ScopeGlobal, "redis.infra:6379"), wantText: []string{`DistributedLock "global" cannot be used`, "spec.scope", "Global is not allowed"}},
		"an endpoint outside the policy":       {lock: lock("local", locksv1alpha1.ScopeNamespace, "127.0.0.1:6379"), wantText: []string{`DistributedLock "local" cannot be used`, "spec.backend.redis.endpoints[0]", "loopback"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).WithObjects(tc.lock.DeepCopy()).Build()
			registry := backend.NewRegistry(t.Context(), c, nil, logr.Discard())
			registry.SetPolicy(backend.Policy{Endpoints: loopbackDenied}, c)
			g := &JobGate{Reader: c, APIReader: c, Check: registry.Check}
			job := makeJob("j").Annotation(locksv1alpha1.AnnotationLock, tc.lock.Name).Container("main").Obj()

			err := g.Default(t.Context(), job)

			if len(tc.wantText) == 0 {
				if err != nil || job.Labels[locksv1alpha1.LabelLock] != tc.lock.Name {
					t.Fatalf("Default = %v, labels %v; want the Job gated", err, job.Labels)
				}
				return
			}
			if diff := cmp.Diff([]string{"metadata.annotations[lockwarden.io/lock]"}, invalidFields(t, err)); diff != "" {
				t.Errorf("fields of the Invalid error (-want,+got):\n%s", diff)
			}
			for _, w := range tc.wantText {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
