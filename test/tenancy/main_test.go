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
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

const (
	// namePrefix is config/default's namePrefix, given here to the objects
	// read from config/ so that they carry their deployed names.
	namePrefix = "lockwarden-"
	// policyName is the ValidatingAdmissionPolicy (and binding) of config/policy, as deployed.
	policyName = namePrefix + "job-gate"

	// operatorNamespace and operatorServiceAccount are where and as whom
	// config/default runs the manager.
	operatorNamespace      = "lockwarden-system"
	operatorServiceAccount = namePrefix + "controller-manager"
	// operatorUser is the manager's username: the one identity the policy lets through.
	operatorUser = "system:serviceaccount:" + operatorNamespace + ":" + operatorServiceAccount

	// tenantUser, in tenantGroup, has the edit ClusterRole in tenantNamespace only.
	tenantUser      = "tenant@example.com"
	tenantGroup     = "team-a"
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
	flag.Parse()
	if testing.Short() {
		// Every test here needs the control plane: they skip.
		os.Exit(m.Run())
	}
	e, err := kubetest.StartEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	env = e
	// The edit role is aggregated from its parts, and the policy
	// type-checked, by kube-controller-manager.
	err = e.StartControllers(kubetest.ClusterRoleAggregation, kubetest.ValidatingAdmissionPolicyStatus)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = setUp(ctx)
		cancel()
	}
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, "set up the tenancy tests:", err)
	} else {
		code = m.Run()
	}
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop envtest:", err)
	}
	os.Exit(code)
}

// setUp installs lockwarden's RBAC and the policy, and makes both identities.
func setUp(ctx context.Context) error {
	if err := installOperator(ctx); err != nil {
		return err
	}
	if err := installPolicy(ctx); err != nil {
		return err
	}
	if err := createNamespace(ctx, tenantNamespace); err != nil {
		return err
	}
	if err := grantTenantEdit(ctx, tenantNamespace); err != nil {
		return err
	}
	var err error
	if asOperator, err = userClient(operatorUser, "system:serviceaccounts", "system:serviceaccounts:"+operatorNamespace); err != nil {
		return err
	}
	if asTenant, err = userClient(tenantUser, tenantGroup); err != nil {
		return err
	}
	return nil
}

// installOperator binds config/rbac/role.yaml's ClusterRole to the
// operator's ServiceAccount, as config/rbac/role_binding.yaml does once
// config/default named it. The ServiceAccount object is not needed: RBAC
// matches the username.
func installOperator(ctx context.Context) error {
	if err := createNamespace(ctx, operatorNamespace); err != nil {
		return err
	}
	roles, err := readConfig("config/rbac/role.yaml")
	if err != nil {
		return err
	}
	if len(roles) != 1 || roles[0].GetKind() != "ClusterRole" {
		return fmt.Errorf("config/rbac/role.yaml: want one ClusterRole, got %d objects", len(roles))
	}
	if err := env.Apply(ctx, roles...); err != nil {
		return err
	}
	return create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: namePrefix + "manager-rolebinding"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: roles[0].GetName()},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: operatorServiceAccount, Namespace: operatorNamespace}},
	})
}

// installPolicy applies config/policy (the files its kustomization lists)
// and waits until the API server enforces it.
func installPolicy(ctx context.Context) error {
	root, err := kubetest.ModuleRoot()
	if err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(root, "config", "policy", "kustomization.yaml"))
	if err != nil {
		return err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		return fmt.Errorf("config/policy/kustomization.yaml: %w", err)
	}
	var paths []string
	for _, r := range k.Resources {
		paths = append(paths, filepath.Join("config", "policy", r))
	}
	objs, err := readConfig(paths...)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if o.GetKind() == "ValidatingAdmissionPolicyBinding" {
			ref, _, _ := unstructured.NestedString(o.Object, "spec", "policyName")
			if err := unstructured.SetNestedField(o.Object, namePrefix+ref, "spec", "policyName"); err != nil {
				return err
			}
		}
	}
	if err := env.Apply(ctx, objs...); err != nil {
		return err
	}
	if err := checkTypes(ctx); err != nil {
		return err
	}
	return waitEnforced(ctx)
}

// readConfig reads manifests from config/ and gives them config/default's
// name prefix (kustomize's namePrefix).
func readConfig(paths ...string) ([]*unstructured.Unstructured, error) {
	objs, err := kubetest.ReadManifests(paths...)
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		o.SetName(namePrefix + o.GetName())
	}
	return objs, nil
}

// checkTypes waits for the API server to type-check the policy against the
// Job schema and fails on any warning (a misspelt field, a type error): such
// an expression would fail at admission and, with failurePolicy Fail, refuse
// every Job.
func checkTypes(ctx context.Context) error {
	var p admissionregistrationv1.ValidatingAdmissionPolicy
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: policyName}, &p); err != nil {
			return false, err
		}
		return p.Status.ObservedGeneration == p.Generation && p.Status.TypeChecking != nil, nil
	})
	if err != nil {
		return fmt.Errorf("ValidatingAdmissionPolicy %s was not type-checked: %w", policyName, err)
	}
	var warnings []string
	for _, w := range p.Status.TypeChecking.ExpressionWarnings {
		warnings = append(warnings, w.FieldRef+": "+w.Warning)
	}
	if len(warnings) > 0 {
		return fmt.Errorf("ValidatingAdmissionPolicy %s does not type-check:\n%s", policyName, strings.Join(warnings, "\n"))
	}
	return nil
}

// waitEnforced waits until the policy refuses a Job it must refuse (the API
// server loads policies asynchronously), with a dry run as the administrator.
// It fails if the admission plugin is off. It is on by default since
// Kubernetes 1.30, and envtest turns off only the ServiceAccount plugin, so
// the API server needs no flag.
func waitEnforced(ctx context.Context) error {
	probe := newJob("policy-probe", "default").Obj()
	probe.Labels = map[string]string{locksv1alpha1.LabelLock: "probe"} // a label without the annotation
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = env.Client.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		return last != nil && strings.Contains(last.Error(), policyName), nil
	})
	if err != nil {
		return fmt.Errorf("the API server does not enforce ValidatingAdmissionPolicy %s (is its admission plugin on?): %w; last dry run: %w", policyName, err, last)
	}
	return nil
}

// grantTenantEdit gives tenantGroup the built-in edit ClusterRole in
// namespace, as config/samples/tenant does, once edit includes what
// aggregates into it: the built-in system:aggregate-to-edit (Jobs) and
// config/rbac's DistributedLock editor role.
func grantTenantEdit(ctx context.Context, namespace string) error {
	editors, err := readConfig("config/rbac/distributedlock_editor_role.yaml")
	if err != nil {
		return err
	}
	if err := env.Apply(ctx, editors...); err != nil {
		return err
	}
	if err := waitAggregated(ctx, "edit", editors[0].GetName(), "system:aggregate-to-edit"); err != nil {
		return err
	}
	return create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: tenantGroup + "-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: tenantGroup}},
	})
}

// waitAggregated waits until the aggregated ClusterRole name holds every rule
// of the ClusterRoles parts (kubetest.ClusterRoleAggregation).
func waitAggregated(ctx context.Context, name string, parts ...string) error {
	var want []rbacv1.PolicyRule
	for _, p := range parts {
		var r rbacv1.ClusterRole
		if err := env.Client.Get(ctx, client.ObjectKey{Name: p}, &r); err != nil {
			return err
		}
		want = append(want, r.Rules...)
	}
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var r rbacv1.ClusterRole
		if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &r); err != nil {
			return false, err
		}
		for _, w := range want {
			if !slices.ContainsFunc(r.Rules, func(g rbacv1.PolicyRule) bool { return equality.Semantic.DeepEqual(g, w) }) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("ClusterRole %s does not aggregate %v: %w", name, parts, err)
	}
	return nil
}

// userClient makes a user with a client certificate and returns its client.
func userClient(name string, groups ...string) (client.Client, error) {
	cfg, err := env.AddUser(name, groups...)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200 // client-go's default (5 per second) would slow every test
	return env.NewClient(cfg)
}

// create creates obj as the administrator; it may exist already.
func create(ctx context.Context, obj client.Object) error {
	if err := env.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create %T %s: %w", obj, client.ObjectKeyFromObject(obj), err)
	}
	return nil
}

func createNamespace(ctx context.Context, name string) error {
	return create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
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
	if err := grantTenantEdit(context.Background(), namespace); err != nil {
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
func deniedByPolicy(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policyName+"'")
}
