package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

func owner(apiVersion, kind, name string, uid types.UID) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: ptr.To(true)}
}

func newPod(annotations map[string]string, owners ...metav1.OwnerReference) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "web-", Namespace: "default", Annotations: annotations, OwnerReferences: owners},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
	}
}

func TestPodGate(t *testing.T) {
	t.Parallel()
	billing := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: "default"}}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-5d4f", Namespace: "default", UID: "uid-rs",
		OwnerReferences: []metav1.OwnerReference{owner("apps/v1", "Deployment", "web", "uid-deploy")}}}
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default", UID: "uid-sts"}}
	lock := map[string]string{locksv1alpha1.AnnotationLock: "billing"}
	workloadMode := map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationHolderMode: "Workload"}
	cases := map[string]struct {
		pod *corev1.Pod
		// wantMode and wantWorkload are the annotations of a gated Pod;
		// wantMode "" means the Pod is left as it came.
		wantMode, wantWorkload string
		wantErr                []string // substrings of the error
	}{
		"a bare Pod that names a lock holds it for itself": {
			pod: newPod(lock), wantMode: "Pod",
		},
		"a Deployment's Pod records its Deployment through its ReplicaSet": {
			pod: newPod(lock, owner("apps/v1", "ReplicaSet", "web-5d4f", "uid-rs")), wantMode: "Pod", wantWorkload: "Deployment/web/uid-deploy",
		},
		"a StatefulSet's Pod in Workload mode records its StatefulSet": {
			pod: newPod(workloadMode, owner("apps/v1", "StatefulSet", "db", "uid-sts")), wantMode: "Workload", wantWorkload: "StatefulSet/db/uid-sts",
		},
		"an owner reference with another UID than the ReplicaSet of that name names no workload": {
			pod:     newPod(workloadMode, owner("apps/v1", "ReplicaSet", "web-5d4f", "uid-other")),
			wantErr: []string{"metadata.annotations[lockwarden.io/holder-mode]"},
		},
		"an owner reference to a StatefulSet that does not exist names no workload": {
			pod: newPod(lock, owner("apps/v1", "StatefulSet", "ghost", "uid-ghost")), wantMode: "Pod",
		},
		"a Pod cannot claim another workload, a token or a place": {
			pod: newPod(map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationWorkload: "Deployment/payroll/uid-x",
				locksv1alpha1.AnnotationFencingToken: "99", locksv1alpha1.AnnotationHolder: "someone"}),
			wantMode: "Pod",
		},
		"a Job's Pod is the Job gate's": {
			pod: newPod(lock, owner("batch/v1", "Job", "nightly", "uid-job")),
		},
		"a Pod that names no lock is left alone": {
			pod: newPod(nil, owner("apps/v1", "ReplicaSet", "web-5d4f", "uid-rs")),
		},
		"a bare Pod cannot hold per workload": {
			pod:     newPod(workloadMode),
			wantErr: []string{"metadata.annotations[lockwarden.io/holder-mode]", `use "Pod"`},
		},
		"an unknown holder mode names the valid ones": {
			pod:     newPod(map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationHolderMode: "Cluster"}),
			wantErr: []string{"metadata.annotations[lockwarden.io/holder-mode]", `"Pod"`, `"Workload"`},
		},
		"an unknown handover names the valid one": {
			pod:     newPod(map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationHandover: "Now"}),
			wantErr: []string{"metadata.annotations[lockwarden.io/handover]", `"Terminating"`},
		},
		"a priority that is not an integer names the annotation": {
			pod:     newPod(map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationPriority: "urgent"}),
			wantErr: []string{"metadata.annotations[lockwarden.io/priority]", `"urgent"`, "integer"},
		},
		"a Pod's priority is accepted": {
			pod:      newPod(map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationPriority: "100"}),
			wantMode: "Pod",
		},
		"a lock that does not exist is refused": {
			pod:     newPod(map[string]string{locksv1alpha1.AnnotationLock: "payroll"}),
			wantErr: []string{`no DistributedLock "payroll" in namespace "default"`},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).WithObjects(billing.DeepCopy(), rs.DeepCopy(), sts.DeepCopy()).Build()
			g := &PodGate{Reader: c, APIReader: c}
			pod := tc.pod.DeepCopy()
			err := g.Default(context.Background(), pod)
			if len(tc.wantErr) > 0 {
				if err == nil || !apierrors.IsInvalid(err) {
					t.Fatalf("Default: %v, want an Invalid error", err)
				}
				for _, s := range tc.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q lacks %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Default: %v", err)
			}
			if tc.wantMode == "" {
				if diff := cmp.Diff(tc.pod, pod); diff != "" {
					t.Errorf("the Pod was changed (-came +left):\n%s", diff)
				}
				return
			}
			if pod.Labels[locksv1alpha1.LabelLock] != "billing" || !slices.Contains(pod.Finalizers, locksv1alpha1.Finalizer) {
				t.Errorf("labels %v, finalizers %v: want the lock label and the finalizer", pod.Labels, pod.Finalizers)
			}
			if !slices.ContainsFunc(pod.Spec.SchedulingGates, func(s corev1.PodSchedulingGate) bool { return s.Name == "lockwarden.io/lock" }) {
				t.Errorf("scheduling gates %v lack lockwarden.io/lock", pod.Spec.SchedulingGates)
			}
			if got := pod.Annotations[locksv1alpha1.AnnotationHolderMode]; got != tc.wantMode {
				t.Errorf("holder mode %q, want %q", got, tc.wantMode)
			}
			if got := pod.Annotations[locksv1alpha1.AnnotationWorkload]; got != tc.wantWorkload {
				t.Errorf("workload %q, want %q", got, tc.wantWorkload)
			}
			for _, k := range []string{locksv1alpha1.AnnotationFencingToken, locksv1alpha1.AnnotationHolder} {
				if v, ok := pod.Annotations[k]; ok {
					t.Errorf("a new Pod keeps %s=%q", k, v)
				}
			}
			if diff := cmp.Diff(gateEnv("billing"), pod.Spec.Containers[0].Env); diff != "" {
				t.Errorf("container env (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPodGateFailsWhenTheReplicaSetCannotBeRead(t *testing.T) {
	t.Parallel()
	billing := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: "default"}}
	c := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).WithObjects(billing).Build()
	g := &PodGate{Reader: c, APIReader: failingReader{c}}
	err := g.Default(context.Background(), newPod(map[string]string{locksv1alpha1.AnnotationLock: "billing"}, owner("apps/v1", "ReplicaSet", "web-5d4f", "uid-rs")))
	if !apierrors.IsInternalError(err) {
		t.Fatalf("Default: %v, want an internal error (retried), never a Pod gated without its workload", err)
	}
}

type failingReader struct{ client.Reader }

func (failingReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("connection refused")
}

// deployment is a Deployment of replicas Pods on lock, with its template's annotations.
func deployment(replicas int32, strategy appsv1.DeploymentStrategy, meta, template map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", Annotations: meta},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas), Strategy: strategy,
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: template}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}},
	}
}

func rolling(unavailable, surge intstr.IntOrString) appsv1.DeploymentStrategy {
	return appsv1.DeploymentStrategy{Type: appsv1.RollingUpdateDeploymentStrategyType, RollingUpdate: &appsv1.RollingUpdateDeployment{MaxUnavailable: &unavailable, MaxSurge: &surge}}
}

// admit runs the workload webhook on obj and returns the object it would store and the response.
func admit(t *testing.T, g *WorkloadGate, obj runtime.Object, kind string) (map[string]any, admission.Response) {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Kind: metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: kind}, Namespace: "default", Operation: admissionv1.Create,
		Object: runtime.RawExtension{Raw: raw},
	}}
	resp := g.Handle(context.Background(), req)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	for _, op := range resp.Patches {
		applyOp(t, out, op.Operation, op.Path, op.Value)
	}
	return out, resp
}

// applyOp applies one JSON patch operation (add, replace, remove) to doc.
func applyOp(t *testing.T, doc map[string]any, op, path string, value any) {
	t.Helper()
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for i := range parts {
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(parts[i], "~1", "/"), "~0", "~")
	}
	cur := doc
	for _, p := range parts[:len(parts)-1] {
		next, ok := cur[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			cur[p] = next
		}
		cur = next
	}
	last := parts[len(parts)-1]
	switch op {
	case "add", "replace":
		cur[last] = value
	case "remove":
		delete(cur, last)
	default:
		t.Fatalf("unexpected patch operation %s %s", op, path)
	}
}

func templateAnnotations(obj map[string]any) map[string]any {
	a, _, _ := unstructuredMap(obj, "spec", "template", "metadata", "annotations")
	return a
}

func unstructuredMap(obj map[string]any, path ...string) (map[string]any, bool, error) {
	cur := obj
	for _, p := range path {
		next, ok := cur[p].(map[string]any)
		if !ok {
			return nil, false, nil
		}
		cur = next
	}
	return cur, true, nil
}

func TestWorkloadGate(t *testing.T) {
	t.Parallel()
	single := &locksv1alpha1.DistributedLock{ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: "default"}, Spec: locksv1alpha1.DistributedLockSpec{MaxHolders: 1}}
	c := fake.NewClientBuilder().WithScheme(kubetest.Scheme()).WithObjects(single).Build()
	g := &WorkloadGate{Reader: c, APIReader: c}
	lock := map[string]string{locksv1alpha1.AnnotationLock: "billing"}

	t.Run("the Deployment's own annotation reaches its pod template", func(t *testing.T) {
		t.Parallel()
		out, resp := admit(t, g, deployment(1, rolling(intstr.FromInt32(1), intstr.FromInt32(0)), map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationHolderMode: "Workload"}, nil), "Deployment")
		if !resp.Allowed {
			t.Fatalf("refused: %v", resp.Result)
		}
		want := map[string]any{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationHolderMode: "Workload", locksv1alpha1.AnnotationSyncedFromWorkload: "lockwarden.io/lock,lockwarden.io/holder-mode"}
		if diff := cmp.Diff(want, templateAnnotations(out)); diff != "" {
			t.Errorf("template annotations (-want +got):\n%s", diff)
		}
		if len(resp.Warnings) != 0 {
			t.Errorf("warnings %q for a Deployment held per workload", resp.Warnings)
		}
	})
	t.Run("an annotation removed from the Deployment leaves its template", func(t *testing.T) {
		t.Parallel()
		d := deployment(1, rolling(intstr.FromInt32(1), intstr.FromInt32(0)), map[string]string{locksv1alpha1.AnnotationLock: "billing"},
			map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationHolderMode: "Workload", locksv1alpha1.AnnotationSyncedFromWorkload: "lockwarden.io/lock,lockwarden.io/holder-mode"})
		out, resp := admit(t, g, d, "Deployment")
		if !resp.Allowed {
			t.Fatalf("refused: %v", resp.Result)
		}
		want := map[string]any{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationSyncedFromWorkload: "lockwarden.io/lock"}
		if diff := cmp.Diff(want, templateAnnotations(out)); diff != "" {
			t.Errorf("template annotations (-want +got):\n%s", diff)
		}
	})
	t.Run("the template's own value wins", func(t *testing.T) {
		t.Parallel()
		d := deployment(1, appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}, map[string]string{locksv1alpha1.AnnotationHolderMode: "Workload"},
			map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationHolderMode: "Pod"})
		out, _ := admit(t, g, d, "Deployment")
		if got := templateAnnotations(out)[locksv1alpha1.AnnotationHolderMode]; got != "Pod" {
			t.Errorf("holder mode %v, want the template's own Pod", got)
		}
	})
	t.Run("a bad holder mode is refused with the field", func(t *testing.T) {
		t.Parallel()
		_, resp := admit(t, g, deployment(1, rolling(intstr.FromInt32(1), intstr.FromInt32(0)), nil, map[string]string{locksv1alpha1.AnnotationLock: "billing", locksv1alpha1.AnnotationHolderMode: "Both"}), "Deployment")
		if resp.Allowed || !strings.Contains(resp.Result.Message, "spec.template.metadata.annotations[lockwarden.io/holder-mode]") {
			t.Errorf("allowed %v, message %q: want a refusal naming the field", resp.Allowed, resp.Result.Message)
		}
	})

	warns := map[string]struct {
		replicas int32
		strategy appsv1.DeploymentStrategy
		mode     string
		want     string // substring of the one warning; "" for none
	}{
		"maxUnavailable 0 stops the rollout":          {1, rolling(intstr.FromInt32(0), intstr.FromInt32(1)), "", "at least 1"},
		"the default 25% of 3 is 0":                   {3, appsv1.DeploymentStrategy{}, "", "at least 3"},
		"maxUnavailable 1 rolls a single Pod":         {1, rolling(intstr.FromInt32(1), intstr.FromInt32(0)), "", ""},
		"three Pods on one slot need 3 unavailable":   {3, rolling(intstr.FromInt32(2), intstr.FromInt32(1)), "", "at least 3"},
		"Recreate always rolls":                       {3, appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}, "", ""},
		"per workload all Pods share the lease":       {1, rolling(intstr.FromInt32(0), intstr.FromInt32(1)), "Workload", ""},
		"100% unavailable rolls three Pods":           {3, rolling(intstr.FromString("100%"), intstr.FromInt32(0)), "", ""},
		"both 0 is read as maxUnavailable 1 (single)": {1, rolling(intstr.FromInt32(0), intstr.FromInt32(0)), "", ""},
	}
	for name, tc := range warns {
		t.Run("warning: "+name, func(t *testing.T) {
			t.Parallel()
			template := map[string]string{locksv1alpha1.AnnotationLock: "billing"}
			if tc.mode != "" {
				template[locksv1alpha1.AnnotationHolderMode] = tc.mode
			}
			_, resp := admit(t, g, deployment(tc.replicas, tc.strategy, nil, template), "Deployment")
			if !resp.Allowed {
				t.Fatalf("refused: %v", resp.Result)
			}
			switch {
			case tc.want == "" && len(resp.Warnings) > 0:
				t.Errorf("warnings %q, want none", resp.Warnings)
			case tc.want != "" && (len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], tc.want)):
				t.Errorf("warnings %q, want one containing %q", resp.Warnings, tc.want)
			}
		})
	}
	t.Run("a StatefulSet beyond its slots is warned about its ordered start and its updates", func(t *testing.T) {
		t.Parallel()
		s := &appsv1.StatefulSet{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"}, ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default"},
			Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2), Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: lock}}}}
		_, resp := admit(t, g, s, "StatefulSet")
		if len(resp.Warnings) != 2 || !strings.Contains(resp.Warnings[0], "podManagementPolicy Parallel") || !strings.Contains(resp.Warnings[1], "OnDelete") {
			t.Errorf("warnings %q, want the ordered start and the rolling update", resp.Warnings)
		}
	})
	t.Run("annotating a running Deployment warns that its Pods overlap the new ones", func(t *testing.T) {
		t.Parallel()
		oldDeploy := deployment(1, rolling(intstr.FromInt32(1), intstr.FromInt32(0)), nil, nil)
		newDeploy := deployment(1, rolling(intstr.FromInt32(1), intstr.FromInt32(0)), lock, nil)
		oldRaw, _ := json.Marshal(oldDeploy)
		raw, _ := json.Marshal(newDeploy)
		resp := g.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Kind: metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, Name: "web", Namespace: "default", Operation: admissionv1.Update,
			Object: runtime.RawExtension{Raw: raw}, OldObject: runtime.RawExtension{Raw: oldRaw},
		}})
		if len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "scale it to 0 first") {
			t.Errorf("warnings %q, want the one about the running ungated Pods", resp.Warnings)
		}
		// Already gated before: no such warning.
		oldRaw, _ = json.Marshal(deployment(1, rolling(intstr.FromInt32(1), intstr.FromInt32(0)), nil, lock))
		resp = g.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Kind: metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, Name: "web", Namespace: "default", Operation: admissionv1.Update,
			Object: runtime.RawExtension{Raw: raw}, OldObject: runtime.RawExtension{Raw: oldRaw},
		}})
		if len(resp.Warnings) != 0 {
			t.Errorf("warnings %q for a Deployment gated before", resp.Warnings)
		}
	})
	t.Run("a missing lock is a warning, not a refusal", func(t *testing.T) {
		t.Parallel()
		_, resp := admit(t, g, deployment(1, appsv1.DeploymentStrategy{}, nil, map[string]string{locksv1alpha1.AnnotationLock: "payroll"}), "Deployment")
		if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], `no DistributedLock "payroll"`) {
			t.Errorf("allowed %v, warnings %q", resp.Allowed, resp.Warnings)
		}
	})
}
