package devcluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// JobGatePolicy is the name of config/default's ValidatingAdmissionPolicy
// (and of its binding) that keeps a gated Job's lock label, annotations,
// finalizer and suspension in the operator's hands.
const JobGatePolicy = "lockwarden-job-gate"

// LockLeasePolicy is config/default's policy that keeps the kubernetes
// store's Leases to the operator.
const LockLeasePolicy = "lockwarden-lock-leases"

// PodGatePolicy is config/default's ValidatingAdmissionPolicy that keeps a
// gated Pod's scheduling gate, token, label and finalizer in the operator's hands.
const PodGatePolicy = "lockwarden-pod-gate"

// fieldManager is the server-side apply field manager of what the cluster installs.
const fieldManager = "lockwarden-devcluster"

// productionKinds are the kinds of config/default the cluster installs as a
// real install does, and whether they are namespaced. The rest is left out:
// the Namespace, CRDs and MutatingWebhookConfiguration are installed by the
// cluster itself (the webhook pointed at the operator's local port), and the
// Deployment, Services, PodDisruptionBudget, NetworkPolicies and the webhook
// certificate Secret belong to an operator that runs as a Pod.
var productionKinds = map[schema.GroupKind]bool{
	{Group: "", Kind: "ServiceAccount"}:                                               true,
	{Group: "rbac.authorization.k8s.io", Kind: "Role"}:                                true,
	{Group: "rbac.authorization.k8s.io", Kind: "RoleBinding"}:                         true,
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"}:                         false,
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRoleBinding"}:                  false,
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingAdmissionPolicy"}:        false,
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingAdmissionPolicyBinding"}: false,
}

// Kustomize returns the project's pinned kustomize, bin/kustomize in the
// checkout at root, building it with `make kustomize` when it is missing.
func Kustomize(ctx context.Context, root string) (string, error) {
	bin := filepath.Join(root, "bin", "kustomize")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	cmd := exec.CommandContext(ctx, "make", "kustomize")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("bin/kustomize is missing and `make kustomize` failed (%w); the cluster installs config/default's RBAC and admission policy with it:\n%s", err, out)
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("`make kustomize` did not build %s: %w", bin, err)
	}
	return bin, nil
}

// RenderDefault renders config/default with the pinned kustomize: what
// `make deploy` applies.
func RenderDefault(ctx context.Context, root string) ([]byte, error) {
	kustomize, err := Kustomize(ctx, root)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, kustomize, "build", filepath.Join(root, "config", "default"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("kustomize build config/default: %w\n%s", err, stderr.String())
	}
	return out, nil
}

// ProductionObjects returns the objects of rendered config/default that the
// cluster installs (see productionKinds), in their order, without the
// namespace kustomize gives cluster-scoped objects it does not know (the
// admission policy's). It fails when one of those kinds is missing.
func ProductionObjects(rendered []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	seen := map[schema.GroupKind]bool{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(rendered)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read rendered config/default: %w", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			return nil, fmt.Errorf("parse rendered config/default: %w", err)
		}
		if len(u.Object) == 0 {
			continue
		}
		gk := u.GroupVersionKind().GroupKind()
		namespaced, ok := productionKinds[gk]
		if !ok {
			continue
		}
		if !namespaced {
			u.SetNamespace("")
		} else if u.GetNamespace() == "" {
			return nil, fmt.Errorf("rendered config/default: %s %s has no namespace", gk.Kind, u.GetName())
		}
		seen[gk] = true
		out = append(out, u)
	}
	var missing []string
	for gk := range productionKinds {
		if !seen[gk] {
			missing = append(missing, gk.Kind)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return nil, fmt.Errorf("rendered config/default has no %s", strings.Join(missing, ", "))
	}
	return out, nil
}

// installProductionObjects renders config/default and applies its RBAC and
// admission policy (productionKinds) with server-side apply, then waits
// until the operator's RBAC and the job-gate policy are in effect.
func (c *Cluster) installProductionObjects(ctx context.Context) error {
	rendered, err := RenderDefault(ctx, c.Root)
	if err != nil {
		return err
	}
	objs, err := ProductionObjects(rendered)
	if err != nil {
		return err
	}
	for _, u := range objs {
		if err := c.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(fieldManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("apply %s %s from config/default: %w", u.GetKind(), client.ObjectKeyFromObject(u), err)
		}
	}
	c.opts.logf("applied %d RBAC and admission policy objects of config/default", len(objs))
	if err := c.waitOperatorRBAC(ctx); err != nil {
		return err
	}
	return c.waitJobGatePolicy(ctx)
}

// waitOperatorRBAC waits until the API server authorizes OperatorUser for a
// cluster-wide right (the manager ClusterRole's binding) and a right in its
// namespace (the owner-key Role's binding), which the operator needs as soon
// as it starts.
func (c *Cluster) waitOperatorRBAC(ctx context.Context) error {
	checks := []authorizationv1.ResourceAttributes{
		{Group: locksv1alpha1.GroupVersion.Group, Resource: "distributedlocks", Verb: "watch"},
		{Namespace: OperatorNamespace, Resource: "secrets", Verb: "create"},
	}
	return c.waitFor(ctx, c.apiserver, "config/default's RBAC to allow "+OperatorUser+" to watch distributedlocks and create Secrets in "+OperatorNamespace,
		func(ctx context.Context) (bool, error) {
			for _, ra := range checks {
				sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
					User:               OperatorUser,
					Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + OperatorNamespace, "system:authenticated"},
					ResourceAttributes: &ra,
				}}
				if err := c.Client.Create(ctx, sar); err != nil {
					return false, err
				}
				if !sar.Status.Allowed {
					return false, fmt.Errorf("%s %s in %q: not allowed (yet): %s", ra.Verb, ra.Resource, ra.Namespace, sar.Status.Reason)
				}
			}
			return true, nil
		})
}

// waitJobGatePolicy waits until the API server enforces the job-gate policy,
// which it loads some time after the objects are created: until a dry-run
// create of a Job labelled lockwarden.io/lock without the annotation (which
// only the webhook labels) is refused by it. No webhook is called for that Job.
func (c *Cluster) waitJobGatePolicy(ctx context.Context) error {
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, startTimeout, true, func(ctx context.Context) (bool, error) {
		err := c.Client.Create(ctx, gateProbeJob(), client.DryRunAll)
		switch {
		case err == nil:
			lastErr = errors.New("the dry-run create of a Job with a forged lock label was allowed")
			return false, nil
		case strings.Contains(err.Error(), JobGatePolicy):
			return true, nil
		default:
			lastErr = err
			return false, nil
		}
	})
	if err != nil {
		return fmt.Errorf("waiting for the ValidatingAdmissionPolicy %s to be in effect: %w (last: %w)", JobGatePolicy, err, lastErr)
	}
	return nil
}

// gateProbeJob is a valid Job that only the job-gate policy refuses: it
// carries the lock label, which lockwarden's webhook sets, without the
// annotation that would have made the webhook gate it.
func gateProbeJob() *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: metav1.NamespaceDefault,
			Name:      "lockwarden-devcluster-gate-probe",
			Labels:    map[string]string{locksv1alpha1.LabelLock: "probe"},
		},
		Spec: batchv1.JobSpec{
			Suspend: ptr.To(true),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "probe", Image: "busybox:1.37"}},
			}},
		},
	}
}

// applyDevRedisBackend creates, or updates, the ClusterLockBackend
// DevRedisBackend: the first Redis master (on the port it really got),
// usable from every namespace. It records itself as kubectl's last applied
// configuration, as `kubectl create --save-config` does, so that applying
// config/samples (which holds the same backend) updates it quietly.
func (c *Cluster) applyDevRedisBackend(ctx context.Context) error {
	if err := c.applyClusterLockBackend(ctx, devRedisClusterLockBackend(c.Redis[0].Addr)); err != nil {
		return err
	}
	c.opts.logf("ClusterLockBackend %s: %s, every namespace", DevRedisBackend, c.Redis[0].Addr)
	return nil
}

// devRedisClusterLockBackend returns the ClusterLockBackend DevRedisBackend for
// the Redis at addr, selecting every namespace.
func devRedisClusterLockBackend(addr string) *locksv1alpha1.ClusterLockBackend {
	return &locksv1alpha1.ClusterLockBackend{
		TypeMeta:   metav1.TypeMeta{APIVersion: locksv1alpha1.GroupVersion.String(), Kind: "ClusterLockBackend"},
		ObjectMeta: metav1.ObjectMeta{Name: DevRedisBackend},
		Spec: locksv1alpha1.ClusterLockBackendSpec{
			Store:             locksv1alpha1.Store{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{addr}}},
			NamespaceSelector: &metav1.LabelSelector{},
		},
	}
}
