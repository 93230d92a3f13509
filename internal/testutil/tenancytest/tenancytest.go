// Package tenancytest installs what a real lockwarden installation puts in a
// cluster around the manager, in an envtest control plane: the manager's RBAC
// from config/rbac and the admission policy from config/policy, named as
// config/default names them, and a tenant with the usual namespace edit
// rights. Suites that test what tenants can and cannot do start from it.
package tenancytest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

const (
	// NamePrefix is config/default's namePrefix, given to the objects read
	// from config/ so that they carry their deployed names.
	NamePrefix = "lockwarden-"
	// PolicyName is the Job gate's ValidatingAdmissionPolicy (and binding)
	// of config/policy, as deployed.
	PolicyName = NamePrefix + "job-gate"
	// PodPolicyName is the Pod gate's ValidatingAdmissionPolicy (and binding).
	PodPolicyName = NamePrefix + "pod-gate"
	// LockLeasePolicyName is the policy (and binding) of config/policy that
	// keeps the kubernetes store's Leases to the operator, as deployed.
	LockLeasePolicyName = NamePrefix + "lock-leases"
	// OperatorNamespace and OperatorServiceAccount are where and as whom
	// config/default runs the manager.
	OperatorNamespace      = "lockwarden-system"
	OperatorServiceAccount = NamePrefix + "controller-manager"
	// OperatorUser is the manager's username: the one identity the policy lets through.
	OperatorUser = "system:serviceaccount:" + OperatorNamespace + ":" + OperatorServiceAccount
	// TenantUser, in TenantGroup, gets the edit ClusterRole in the namespaces GrantTenantEdit names.
	TenantUser  = "tenant@example.com"
	TenantGroup = "team-a"
)

// OperatorGroups are the groups of OperatorUser, as a ServiceAccount has them.
var OperatorGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + OperatorNamespace}

// Controllers are the kube-controller-manager controllers Install needs
// (env.StartControllers): ClusterRole aggregation, so that edit holds what
// it holds in a cluster, and the policy's type checking.
var Controllers = []string{kubetest.ClusterRoleAggregation, kubetest.ValidatingAdmissionPolicyStatus}

// Install creates the operator's namespace and its RBAC (config/rbac's
// ClusterRole, leader-election, owner-key and self-addresses Roles, with their bindings to
// the operator's ServiceAccount), applies config/policy and waits until the
// API server enforces it. Start Controllers first.
func Install(ctx context.Context, env *kubetest.Env) error {
	if err := createNamespace(ctx, env, OperatorNamespace); err != nil {
		return err
	}
	objs, err := readConfig("config/rbac/role.yaml",
		"config/rbac/leader_election_role.yaml", "config/rbac/leader_election_role_binding.yaml",
		"config/rbac/owner_key_role.yaml", "config/rbac/owner_key_role_binding.yaml",
		"config/rbac/self_addresses_role.yaml", "config/rbac/self_addresses_role_binding.yaml")
	if err != nil {
		return err
	}
	if err := env.Apply(ctx, objs...); err != nil {
		return err
	}
	// config/rbac/role_binding.yaml, as config/default names it.
	if err := create(ctx, env, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: NamePrefix + "manager-rolebinding"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: NamePrefix + "manager-role"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: OperatorServiceAccount, Namespace: OperatorNamespace}},
	}); err != nil {
		return err
	}
	return installPolicy(ctx, env)
}

// installPolicy applies config/policy (the files its kustomization lists)
// and waits until the API server enforces it.
func installPolicy(ctx context.Context, env *kubetest.Env) error {
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
	if err := env.Apply(ctx, objs...); err != nil {
		return err
	}
	if err := checkTypes(ctx, env); err != nil {
		return err
	}
	return waitEnforced(ctx, env)
}

// readConfig reads manifests from config/ and names them as config/default
// does (kustomize's namePrefix and namespace): names and role references
// prefixed, the "system" namespace (of objects and ServiceAccount subjects)
// replaced by OperatorNamespace, cluster-scoped policies left without one.
func readConfig(paths ...string) ([]*unstructured.Unstructured, error) {
	objs, err := kubetest.ReadManifests(paths...)
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		o.SetName(NamePrefix + o.GetName())
		if o.GetNamespace() == "system" {
			o.SetNamespace(OperatorNamespace)
		}
		switch o.GetKind() {
		case "RoleBinding", "ClusterRoleBinding":
			name, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
			if err := unstructured.SetNestedField(o.Object, NamePrefix+name, "roleRef", "name"); err != nil {
				return nil, err
			}
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for i, s := range subjects {
				m := s.(map[string]any)
				if m["kind"] == rbacv1.ServiceAccountKind {
					m["name"] = NamePrefix + fmt.Sprint(m["name"])
					if m["namespace"] == "system" {
						m["namespace"] = OperatorNamespace
					}
				}
				subjects[i] = m
			}
			if err := unstructured.SetNestedSlice(o.Object, subjects, "subjects"); err != nil {
				return nil, err
			}
		case "ValidatingAdmissionPolicyBinding":
			ref, _, _ := unstructured.NestedString(o.Object, "spec", "policyName")
			if err := unstructured.SetNestedField(o.Object, NamePrefix+ref, "spec", "policyName"); err != nil {
				return nil, err
			}
		}
	}
	return objs, nil
}

// checkTypes waits for the API server to type-check the policies against
// the schemas they match and fails on any warning (a misspelt field, a type
// error): such an expression would fail at admission and, with
// failurePolicy Fail, refuse every request it matches.
func checkTypes(ctx context.Context, env *kubetest.Env) error {
	for _, name := range []string{PolicyName, PodPolicyName, LockLeasePolicyName} {
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
				return false, err
			}
			return p.Status.ObservedGeneration == p.Generation && p.Status.TypeChecking != nil, nil
		})
		if err != nil {
			return fmt.Errorf("ValidatingAdmissionPolicy %s was not type-checked: %w", name, err)
		}
		var warnings []string
		for _, w := range p.Status.TypeChecking.ExpressionWarnings {
			warnings = append(warnings, w.FieldRef+": "+w.Warning)
		}
		if len(warnings) > 0 {
			return fmt.Errorf("ValidatingAdmissionPolicy %s does not type-check:\n%s", name, strings.Join(warnings, "\n"))
		}
	}
	return nil
}

// waitEnforced waits until the policy refuses a Job it must refuse (the API
// server loads policies asynchronously), with a dry run as the administrator.
// It fails if the admission plugin is off. It is on by default since
// Kubernetes 1.30, and envtest turns off only the ServiceAccount plugin, so
// the API server needs no flag.
func waitEnforced(ctx context.Context, env *kubetest.Env) error {
	probe := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "policy-probe", Namespace: "default",
			Labels: map[string]string{locksv1alpha1.LabelLock: "probe"}}, // a label without the annotation
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "work", Image: "busybox"}},
		}}},
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = env.Client.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		return last != nil && strings.Contains(last.Error(), PolicyName), nil
	})
	if err != nil {
		return fmt.Errorf("the API server does not enforce ValidatingAdmissionPolicy %s (is its admission plugin on?): %w; last dry run: %w", PolicyName, err, last)
	}
	// The Pod gate's policy: a Pod labelled as gated without the gate.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "policy-probe", Namespace: "default", Labels: map[string]string{locksv1alpha1.LabelLock: "probe"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "work", Image: "busybox"}}},
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		last = env.Client.Create(ctx, pod.DeepCopy(), client.DryRunAll)
		return last != nil && strings.Contains(last.Error(), PodPolicyName), nil
	})
	if err != nil {
		return fmt.Errorf("the API server does not enforce ValidatingAdmissionPolicy %s: %w; last dry run: %w", PodPolicyName, err, last)
	}
	return nil
}

// GrantTenantEdit gives TenantGroup the built-in edit ClusterRole in
// namespace, as config/samples/tenant does, once edit includes what
// aggregates into it: the built-in system:aggregate-to-edit (Jobs) and
// config/rbac's DistributedLock editor role.
func GrantTenantEdit(ctx context.Context, env *kubetest.Env, namespace string) error {
	editors, err := readConfig("config/rbac/distributedlock_editor_role.yaml")
	if err != nil {
		return err
	}
	if err := env.Apply(ctx, editors...); err != nil {
		return err
	}
	if err := waitAggregated(ctx, env, "edit", editors[0].GetName(), "system:aggregate-to-edit"); err != nil {
		return err
	}
	if err := create(ctx, env, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: TenantGroup + "-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: TenantGroup}},
	}); err != nil {
		return err
	}
	return waitTenantAllowed(ctx, env, namespace)
}

// waitTenantAllowed waits until the API server's authorizer, which reads
// RoleBindings from its own informer some time after they are created,
// allows TenantUser to create Jobs and DistributedLocks in namespace.
func waitTenantAllowed(ctx context.Context, env *kubetest.Env, namespace string) error {
	checks := []authorizationv1.ResourceAttributes{
		{Namespace: namespace, Group: batchv1.GroupName, Resource: "jobs", Verb: "create"},
		{Namespace: namespace, Group: locksv1alpha1.GroupVersion.Group, Resource: "distributedlocks", Verb: "create"},
	}
	var last string
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, ra := range checks {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               TenantUser,
				Groups:             []string{TenantGroup, "system:authenticated"},
				ResourceAttributes: &ra,
			}}
			if err := env.Client.Create(ctx, sar); err != nil {
				return false, err
			}
			if !sar.Status.Allowed {
				last = fmt.Sprintf("%s %s.%s: %s", ra.Verb, ra.Resource, ra.Group, sar.Status.Reason)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("the tenant's edit rights in namespace %s are not in effect (last: %s): %w", namespace, last, err)
	}
	return nil
}

// waitAggregated waits until the aggregated ClusterRole name holds every rule
// of the ClusterRoles parts (kubetest.ClusterRoleAggregation).
func waitAggregated(ctx context.Context, env *kubetest.Env, name string, parts ...string) error {
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

// User makes a user with a client certificate and returns its configuration
// and a direct client.
func User(env *kubetest.Env, name string, groups ...string) (*rest.Config, client.Client, error) {
	cfg, err := env.AddUser(name, groups...)
	if err != nil {
		return nil, nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200 // client-go's default (5 per second) would slow every test
	c, err := env.NewClient(cfg)
	return cfg, c, err
}

// DeniedByPolicy reports whether err is the policy's refusal (not RBAC's,
// not validation's).
func DeniedByPolicy(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+PolicyName+"'")
}

// CreateNamespace creates a namespace; it may exist already.
func CreateNamespace(ctx context.Context, env *kubetest.Env, name string) error {
	return createNamespace(ctx, env, name)
}

func createNamespace(ctx context.Context, env *kubetest.Env, name string) error {
	return create(ctx, env, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// create creates obj as the administrator; it may exist already.
func create(ctx context.Context, env *kubetest.Env, obj client.Object) error {
	if err := env.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create %T %s: %w", obj, client.ObjectKeyFromObject(obj), err)
	}
	return nil
}
