package tenancy

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/tenancytest"
)

// gatedPod is a Pod as lockwarden's webhook gates it: labelled, with the
// lock annotation, the scheduling gate and the finalizer.
func gatedPod(name, namespace string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace,
			Labels:      map[string]string{locksv1alpha1.LabelLock: testLock},
			Annotations: map[string]string{locksv1alpha1.AnnotationLock: testLock, locksv1alpha1.AnnotationHolderMode: "Pod"},
			Finalizers:  []string{locksv1alpha1.Finalizer}},
		Spec: corev1.PodSpec{
			SchedulingGates: []corev1.PodSchedulingGate{{Name: locksv1alpha1.SchedulingGate}},
			Containers:      []corev1.Container{{Name: "work", Image: "busybox"}},
		},
	}
}

// createGatedPod creates a gated Pod as the webhook leaves it (the webhook
// does not run here; an administrator creates it, as a workload controller
// would) and removes it when the test ends.
func createGatedPod(t *testing.T, namespace, name string) *corev1.Pod {
	t.Helper()
	pod := gatedPod(name, namespace)
	if err := adminClient(t).Create(context.Background(), pod); err != nil {
		t.Fatalf("create gated Pod: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		var cur corev1.Pod
		if err := adminClient(t).Get(ctx, client.ObjectKeyFromObject(pod), &cur); err != nil {
			return
		}
		_ = adminClient(t).Delete(ctx, &cur, client.GracePeriodSeconds(0))
		patch := client.MergeFrom(cur.DeepCopy())
		cur.Finalizers = nil
		_ = operatorClient(t).Patch(ctx, &cur, patch)
	})
	return pod
}

// patchPod reads pod, applies change and sends the difference as a JSON
// merge patch as c.
func patchPod(t *testing.T, c client.Client, pod *corev1.Pod, change func(*corev1.Pod)) error {
	t.Helper()
	ctx := context.Background()
	var cur corev1.Pod
	if err := adminClient(t).Get(ctx, client.ObjectKeyFromObject(pod), &cur); err != nil {
		t.Fatalf("get Pod %s: %v", pod.Name, err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	change(&cur)
	return c.Patch(ctx, &cur, patch)
}

func wantPodDenied(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s was allowed; want it refused by ValidatingAdmissionPolicy %s", what, tenancytest.PodPolicyName)
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+tenancytest.PodPolicyName+"'") {
		t.Fatalf("%s was refused, but not by ValidatingAdmissionPolicy %s: %v", what, tenancytest.PodPolicyName, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: the refusal does not say %q:\n%v", what, w, err)
		}
	}
}

// TestTenantCannotUngateAPod: a tenant with edit rights cannot start a gated
// Pod without the lock, give it a token, or free it of its finalizer.
func TestTenantCannotUngateAPod(t *testing.T) {
	tests := map[string]struct {
		change func(*corev1.Pod)
		want   []string
	}{
		"removing the scheduling gate": {
			change: func(p *corev1.Pod) { p.Spec.SchedulingGates = nil },
			want:   []string{"scheduling gate lockwarden.io/lock is protected"},
		},
		"writing a fencing token": {
			change: func(p *corev1.Pod) { p.Annotations[locksv1alpha1.AnnotationFencingToken] = "99" },
			want:   []string{"lockwarden.io/fencing-token", "protected"},
		},
		"claiming another workload": {
			change: func(p *corev1.Pod) { p.Annotations[locksv1alpha1.AnnotationWorkload] = "Deployment/payroll/uid" },
			want:   []string{"lockwarden.io/workload"},
		},
		"switching to per-workload holding": {
			change: func(p *corev1.Pod) { p.Annotations[locksv1alpha1.AnnotationHolderMode] = "Workload" },
			want:   []string{"lockwarden.io/holder-mode"},
		},
		"removing the lock label": {
			change: func(p *corev1.Pod) { delete(p.Labels, locksv1alpha1.LabelLock) },
			want:   []string{"label lockwarden.io/lock"},
		},
		"removing the finalizer of a live Pod": {
			change: func(p *corev1.Pod) { p.Finalizers = nil },
			want:   []string{"finalizer locks.lockwarden.io/release"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pod := createGatedPod(t, tenantNamespace, "p-"+strings.ToLower(strings.ReplaceAll(name, " ", "-")))
			wantPodDenied(t, "a tenant "+name, patchPod(t, tenantClient(t), pod, tc.change), tc.want...)
		})
	}
}

// TestTenantCannotCreateAPodThatClaimsTheLock: a new Pod never carries a
// token, nor the gate's label without the gate.
func TestTenantCannotCreateAPodThatClaimsTheLock(t *testing.T) {
	forged := gatedPod("forged", tenantNamespace)
	forged.Annotations[locksv1alpha1.AnnotationFencingToken] = "99"
	wantPodDenied(t, "creating a Pod with a fencing token", tenantClient(t).Create(context.Background(), forged, client.DryRunAll), "lockwarden.io/fencing-token")
	ungated := gatedPod("ungated", tenantNamespace)
	ungated.Spec.SchedulingGates = nil
	wantPodDenied(t, "creating a labelled Pod without the gate", tenantClient(t).Create(context.Background(), ungated, client.DryRunAll), "scheduling gate lockwarden.io/lock")
	stray := gatedPod("stray", tenantNamespace)
	stray.Labels = nil
	wantPodDenied(t, "creating an unlabelled Pod with the gate and finalizer", tenantClient(t).Create(context.Background(), stray, client.DryRunAll), "reserved for Pods that lockwarden gates")
	// Pods that have nothing to do with lockwarden are not checked.
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: tenantNamespace}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "work", Image: "busybox"}}}}
	if err := tenantClient(t).Create(context.Background(), plain, client.DryRunAll); err != nil {
		t.Fatalf("a plain Pod was refused: %v", err)
	}
}

// TestOperatorUngatesAndTenantsStillEdit: lockwarden's own writes pass; a
// tenant keeps its ordinary edits and may drop the finalizer of a Pod being
// deleted (which releases at once, as a forced deletion does).
func TestOperatorUngatesAndTenantsStillEdit(t *testing.T) {
	pod := createGatedPod(t, tenantNamespace, "ungated-by-operator")
	if err := patchPod(t, operatorClient(t), pod, func(p *corev1.Pod) {
		p.Annotations[locksv1alpha1.AnnotationFencingToken] = "7"
		p.Annotations[locksv1alpha1.AnnotationHolder] = "test/" + p.Namespace + "/Pod/" + p.Name
		p.Spec.SchedulingGates = nil
	}); err != nil {
		t.Fatalf("the operator could not write the token and remove the gate in one patch: %v", err)
	}
	if err := patchPod(t, tenantClient(t), pod, func(p *corev1.Pod) { p.Labels["team"] = "payments" }); err != nil {
		t.Fatalf("a tenant could not label its Pod: %v", err)
	}
	if err := tenantClient(t).Delete(context.Background(), pod); err != nil {
		t.Fatalf("a tenant could not delete its Pod: %v", err)
	}
	err := patchPod(t, tenantClient(t), pod, func(p *corev1.Pod) {
		p.Finalizers = slices.DeleteFunc(p.Finalizers, func(f string) bool { return f == locksv1alpha1.Finalizer })
	})
	if err != nil {
		t.Fatalf("a tenant could not remove the finalizer of its Pod being deleted: %v", err)
	}
}
