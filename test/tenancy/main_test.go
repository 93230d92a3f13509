// Package tenancy tests what a tenant - a user with only the usual edit rights
// in a namespace - can and cannot do to lockwarden's gate, against a real
// kube-apiserver (envtest) with config/policy installed and lockwarden's RBAC
// from config/rbac. No manager and no webhook run: a test writes what the
// webhook would into the Jobs it creates, and changes them as the operator's
// identity where lockwarden would.
//
// Two identities:
//   - the operator: the ServiceAccount config/default deploys the manager as
//     (operatorUser), bound to config/rbac/role.yaml's ClusterRole;
//   - a tenant: tenantUser in group tenantGroup, bound to the built-in edit
//     ClusterRole in tenantNamespace only.
//
// Besides the API server and etcd, kube-controller-manager runs two
// controllers: ClusterRole aggregation (so that edit holds what it holds in a
// cluster, DistributedLocks included) and the policy's type checking.
package tenancy

import (
	"context"
	"slices"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/tenancytest"
)

const (
	policyName      = tenancytest.PolicyName
	operatorUser    = tenancytest.OperatorUser
	tenantUser      = tenancytest.TenantUser
	tenantGroup     = tenancytest.TenantGroup
	tenantNamespace = "tenant-a"
)

// env is the control plane; nil under -short.
var env *kubetest.Env

// The identities' clients, made once by TestMain (see operatorClient, tenantClient).
var (
	asOperator client.Client
	asTenant   client.Client
)

func TestMain(m *testing.M) {
	kubetest.MainEnv(m, "tenancy", func(e *kubetest.Env) (func(), error) {
		env = e
		// The edit role is aggregated from its parts, and the policy
		// type-checked, by kube-controller-manager.
		if err := e.StartControllers(tenancytest.Controllers...); err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return nil, setUp(ctx)
	})
}

// setUp installs lockwarden's RBAC and the policy, and makes both identities.
func setUp(ctx context.Context) error {
	if err := tenancytest.Install(ctx, env); err != nil {
		return err
	}
	if err := tenancytest.CreateNamespace(ctx, env, tenantNamespace); err != nil {
		return err
	}
	if err := tenancytest.GrantTenantEdit(ctx, env, tenantNamespace); err != nil {
		return err
	}
	var err error
	if _, asOperator, err = tenancytest.User(env, operatorUser, tenancytest.OperatorGroups...); err != nil {
		return err
	}
	if _, asTenant, err = tenancytest.User(env, tenantUser, tenantGroup); err != nil {
		return err
	}
	return nil
}

// needEnv skips a test that needs the control plane when there is none (-short).
func needEnv(t testing.TB) {
	t.Helper()
	if env == nil {
		t.Skip("needs kube-apiserver and etcd (envtest); skipped with -short")
	}
}

// adminClient returns the administrator's direct client (system:masters: all
// RBAC permissions, but still subject to the policy).
func adminClient(t testing.TB) client.Client {
	t.Helper()
	needEnv(t)
	return env.Client
}

// operatorClient returns a direct client acting as lockwarden's manager
// (operatorUser): config/rbac/role.yaml's permissions, and the one identity
// the policy does not check.
func operatorClient(t testing.TB) client.Client {
	t.Helper()
	needEnv(t)
	return asOperator
}

// tenantClient returns a direct client acting as tenantUser in tenantGroup:
// the edit ClusterRole in tenantNamespace (and in the namespaces given to
// grantTenant), nothing elsewhere.
func tenantClient(t testing.TB) client.Client {
	t.Helper()
	needEnv(t)
	return asTenant
}

// newNamespace creates a namespace with a fresh name for one test. The tenant
// has no rights in it; grantTenant gives them. envtest runs no namespace
// controller, so the namespace is marked for deletion when the test ends but
// its objects remain.
func newNamespace(t testing.TB) string {
	t.Helper()
	needEnv(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "tenancy-"}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), ns); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}

// grantTenant binds the tenant's group to the edit ClusterRole in namespace,
// as in tenantNamespace.
func grantTenant(t testing.TB, namespace string) {
	t.Helper()
	needEnv(t)
	if err := tenancytest.GrantTenantEdit(context.Background(), env, namespace); err != nil {
		t.Fatal(err)
	}
}

// jobBuilder builds test Jobs: newJob(name, ns).Lock("billing").Obj().
type jobBuilder struct{ job *batchv1.Job }

// newJob starts a runnable Job (one container, restartPolicy Never) with no
// lockwarden annotations.
func newJob(name, namespace string) *jobBuilder {
	return &jobBuilder{job: &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: batchv1.JobSpec{
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{{Name: "work", Image: "busybox"}},
				},
			},
		},
	}}
}

// Gated makes the Job look as lockwarden's webhook leaves it at creation:
// the lock label and annotation, the finalizer, and suspended.
func (b *jobBuilder) Gated(lock string) *jobBuilder {
	return b.Label(locksv1alpha1.LabelLock, lock).
		Annotation(locksv1alpha1.AnnotationLock, lock).
		Finalizer(locksv1alpha1.Finalizer).
		Suspend(true)
}

// Label sets a label on the Job.
func (b *jobBuilder) Label(k, v string) *jobBuilder {
	if b.job.Labels == nil {
		b.job.Labels = map[string]string{}
	}
	b.job.Labels[k] = v
	return b
}

// Annotation sets an annotation on the Job.
func (b *jobBuilder) Annotation(k, v string) *jobBuilder {
	if b.job.Annotations == nil {
		b.job.Annotations = map[string]string{}
	}
	b.job.Annotations[k] = v
	return b
}

// TemplateAnnotation sets an annotation on the Job's pod template.
func (b *jobBuilder) TemplateAnnotation(k, v string) *jobBuilder {
	if b.job.Spec.Template.Annotations == nil {
		b.job.Spec.Template.Annotations = map[string]string{}
	}
	b.job.Spec.Template.Annotations[k] = v
	return b
}

// Finalizer adds a finalizer.
func (b *jobBuilder) Finalizer(f string) *jobBuilder {
	if !slices.Contains(b.job.Finalizers, f) {
		b.job.Finalizers = append(b.job.Finalizers, f)
	}
	return b
}

// Suspend sets spec.suspend.
func (b *jobBuilder) Suspend(s bool) *jobBuilder {
	b.job.Spec.Suspend = &s
	return b
}

// Obj returns the Job.
func (b *jobBuilder) Obj() *batchv1.Job { return b.job }

// createGatedJob creates a Job in namespace as lockwarden's webhook leaves
// it (gated by lock), and removes it when the test ends (as the operator: its
// finalizer is protected from everyone else).
//
// The tenant creates it, as in a cluster: a webhook's changes reach the API
// server in the request of whoever creates the Job (and the operator may not
// create Jobs). The policy lets such a Job through, as it must. The tenant
// needs rights in namespace (tenantNamespace, or see grantTenant).
func createGatedJob(t testing.TB, namespace, lock string) *batchv1.Job {
	t.Helper()
	job := newJob("", namespace).Gated(lock).Obj()
	job.GenerateName = "gated-"
	if err := tenantClient(t).Create(context.Background(), job); err != nil {
		t.Fatalf("create a gated Job (as the webhook leaves it) as the tenant: %v", err)
	}
	t.Cleanup(func() { removeJob(t, job) })
	return job
}

// removeJob deletes a Job as the operator does when done with it: finalizer
// removed, then deleted (background propagation: no orphan finalizer, which
// only the garbage collector envtest lacks would remove).
func removeJob(t testing.TB, job *batchv1.Job) {
	t.Helper()
	ctx := context.Background()
	c := operatorClient(t)
	var cur batchv1.Job
	if err := c.Get(ctx, client.ObjectKeyFromObject(job), &cur); err != nil {
		if !apierrors.IsNotFound(err) {
			t.Errorf("get Job %s: %v", job.Name, err)
		}
		return
	}
	if i := slices.Index(cur.Finalizers, locksv1alpha1.Finalizer); i >= 0 {
		patch := client.MergeFrom(cur.DeepCopy())
		cur.Finalizers = slices.Delete(cur.Finalizers, i, i+1)
		if err := c.Patch(ctx, &cur, patch); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("remove the finalizer of Job %s as the operator: %v", job.Name, err)
			return
		}
	}
	err := c.Delete(ctx, &cur, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete Job %s as the operator: %v", job.Name, err)
	}
}

// deniedByPolicy reports whether err is the policy's refusal (not RBAC's, not
// validation's).
func deniedByPolicy(err error) bool { return tenancytest.DeniedByPolicy(err) }
