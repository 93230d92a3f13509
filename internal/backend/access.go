package backend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/netguard"
)

// Policy is the operator's say over which backends a lock may use: every
// decision the manual holder, gated Jobs and the admission webhook make
// about a lock's backend and scope comes from Registry.Check, with this
// policy.
type Policy struct {
	// InlineDisabled refuses spec.backend.redis: locks must name a
	// ClusterLockBackend.
	InlineDisabled bool
	// InlineNeedsAllowList refuses endpoints chosen in a namespace (inline,
	// or in a LockBackend) because no allow-list is set: the manager's
	// default, so that a fresh install is not open to every address.
	InlineNeedsAllowList bool
	// Endpoints restricts where inline endpoints may point (nil: anywhere).
	// It is checked before any connection and again on every dial, against
	// the addresses the names resolve to.
	Endpoints *netguard.EndpointPolicy
	// GlobalScope says where scope Global is allowed with inline endpoints.
	// A ClusterLockBackend decides that itself (globalScopeNamespaceSelector,
	// globalKeyPrefixes).
	GlobalScope GlobalScopePolicy
	// ClusterResourceNamespace is the namespace ClusterLockBackends' Secrets
	// are read from (the operator's own).
	ClusterResourceNamespace string
}

// GlobalScopePolicy says where spec.scope Global is allowed with endpoints a
// namespace chose (inline, or in a LockBackend).
type GlobalScopePolicy struct {
	// AllowAll allows Global in every namespace.
	AllowAll bool
	// NamespaceLabel, when set, allows Global in namespaces labelled <NamespaceLabel>=true.
	NamespaceLabel string
}

// PolicyError says why a lock may not use its backend or scope. Reason is
// one of the api's Reason constants (BackendNotAllowed, BackendNotFound,
// ScopeNotAllowed); Field names the spec field; Message is for the user.
// Nothing was sent anywhere.
type PolicyError struct {
	Field   string
	Reason  string
	Message string
}

func (e *PolicyError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Message) }

// source is a lock's backend after the policy allowed it: the store it
// names, where its Secrets live and how its endpoints are checked.
type source struct {
	// id names the backend in indexes and release notifications (see LockBackendID).
	id   string
	spec Spec
	// secretNamespace is where the Secrets that spec names are read.
	secretNamespace string
	// field prefixes the fields of spec's member in errors.
	field string
	// endpoints checks every dial (nil: admin-owned, unrestricted).
	endpoints *netguard.EndpointPolicy
	// tenant is set for the endpoints a namespace chose (inline, or a
	// LockBackend): their operations get TenantOperationTimeout.
	tenant bool
	// scopes are the only engine keys the client may use (Redis: see
	// redislock.Config.Scopes); none: any key.
	scopes []string
}

// namespaceScopes are the engine keys a namespace's LockBackend may hold:
// the namespace's own, and Global keys where the operator allows the
// namespace Global scope on its own endpoints (inlineGlobalScope). The
// Redis client of the LockBackend touches nothing else, so that a Redis
// user limited to them serves it (docs/security.md, "Tenants on one
// Redis").
func (r *Registry) namespaceScopes(ctx context.Context, namespace string) []string {
	scopes := []string{EngineKey(namespace, locksv1alpha1.ScopeNamespace, "")}
	if r.inlineGlobalScope(ctx, namespace) == nil {
		scopes = append(scopes, EngineKey(namespace, locksv1alpha1.ScopeGlobal, ""))
	}
	return scopes
}

// LockBackendID names the backend a lock uses, from its spec alone: the
// ClusterLockBackend's name, or the inline Redis's ID. Locks with equal IDs
// share a client (with equal credentials) and release notifications.
func LockBackendID(dl *locksv1alpha1.DistributedLock) string {
	if ref := dl.Spec.Backend.ClusterBackendRef; ref != nil {
		return "ClusterLockBackend/" + ref.Name
	}
	if ref := dl.Spec.Backend.BackendRef; ref != nil {
		return NamespacedBackendID(dl.Namespace, ref.Name)
	}
	return ID(dl.Spec.Backend.Redis)
}

// NamespacedBackendID is the backend ID of the LockBackend namespace/name.
func NamespacedBackendID(namespace, name string) string {
	return "LockBackend/" + namespace + "/" + name
}

// Check decides whether dl may use its backend with its scope, without
// connecting anywhere or reading Secrets. The manual holder, every gated
// Job and the admission webhook ask it, so all three decide alike. A
// refusal is a *PolicyError; other errors are failures to read.
func (r *Registry) Check(ctx context.Context, dl *locksv1alpha1.DistributedLock) error {
	_, err := r.check(ctx, dl)
	return err
}

func (r *Registry) check(ctx context.Context, dl *locksv1alpha1.DistributedLock) (*source, error) {
	if ref := dl.Spec.Backend.ClusterBackendRef; ref != nil {
		return r.checkClusterBackend(ctx, dl, ref.Name)
	}
	if ref := dl.Spec.Backend.BackendRef; ref != nil {
		var b locksv1alpha1.LockBackend
		if err := r.objects.Get(ctx, types.NamespacedName{Namespace: dl.Namespace, Name: ref.Name}, &b); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, &PolicyError{Field: "spec.backend.backendRef.name", Reason: locksv1alpha1.ReasonBackendNotFound,
					Message: fmt.Sprintf("LockBackend %q does not exist in namespace %q: create it, or name an existing one (kubectl get lockbackends)", ref.Name, dl.Namespace)}
			}
			return nil, fmt.Errorf("read LockBackend %s/%s: %w", dl.Namespace, ref.Name, err)
		}
		spec := NamespacedSpec(&b)
		if err := spec.Validate(); err != nil {
			return nil, &PolicyError{Field: "spec.backend.backendRef.name", Reason: locksv1alpha1.ReasonInvalidBackend,
				Message: fmt.Sprintf("LockBackend %q cannot be used: %v", ref.Name, err)}
		}
		src, err := r.checkTenantEndpoints(ctx, dl, spec, NamespacedBackendID(dl.Namespace, ref.Name), fmt.Sprintf("LockBackend %s: spec.%s", ref.Name, spec.Field()))
		if err != nil {
			return nil, err
		}
		src.scopes = r.namespaceScopes(ctx, dl.Namespace)
		return src, nil
	}
	rb := dl.Spec.Backend.Redis
	if rb == nil {
		return nil, &PolicyError{Field: "spec.backend", Reason: locksv1alpha1.ReasonInvalidBackend,
			Message: "set redis (inline endpoints), backendRef (a LockBackend) or clusterBackendRef (a ClusterLockBackend)"}
	}
	if err := (Spec{Redis: rb}).Validate(); err != nil {
		return nil, &PolicyError{Field: "spec.backend.redis", Reason: locksv1alpha1.ReasonInvalidBackend,
			Message: strings.Replace(err.Error(), "spec.redis", "spec.backend.redis", 1)}
	}
	return r.checkTenantEndpoints(ctx, dl, Spec{Redis: rb}, ID(rb), "spec.backend.redis")
}

// checkTenantEndpoints decides on endpoints a tenant wrote (inline, or in a
// LockBackend of its namespace, whose Secrets are the namespace's): the
// inline switch, the endpoint policy, and the operator's Global scope rule.
func (r *Registry) checkTenantEndpoints(ctx context.Context, dl *locksv1alpha1.DistributedLock, spec Spec, id, field string) (*source, error) {
	if r.policy.InlineDisabled {
		return nil, &PolicyError{Field: field, Reason: locksv1alpha1.ReasonBackendNotAllowed,
			Message: "endpoints chosen in a namespace (inline, or in a LockBackend) are turned off in this cluster: name a ClusterLockBackend in spec.backend.clusterBackendRef (kubectl get clusterlockbackends)"}
	}
	if r.policy.InlineNeedsAllowList {
		return nil, &PolicyError{Field: field, Reason: locksv1alpha1.ReasonBackendNotAllowed,
			Message: "endpoints chosen in a namespace (inline, or in a LockBackend) are refused until an administrator lists the addresses they may use: the operator's --endpoint-allow (Helm value endpointPolicy.allow; * for any address but the denied ones). Or name a ClusterLockBackend in spec.backend.clusterBackendRef (kubectl get clusterlockbackends)"}
	}
	if p := r.policy.Endpoints; p != nil {
		for i, e := range spec.Endpoints() {
			if err := p.Check(e); err != nil {
				return nil, &PolicyError{Field: fmt.Sprintf("%s.%s", field, spec.endpointField(i)), Reason: locksv1alpha1.ReasonBackendNotAllowed,
					Message: fmt.Sprintf("%v; no connection was made. Use an endpoint the cluster's endpoint policy allows, or a ClusterLockBackend", err)}
			}
		}
	}
	if dl.Spec.Scope == locksv1alpha1.ScopeGlobal {
		if err := r.inlineGlobalScope(ctx, dl.Namespace); err != nil {
			return nil, err
		}
	}
	return &source{id: id, spec: spec, secretNamespace: dl.Namespace, field: field, endpoints: r.policy.Endpoints, tenant: true}, nil
}

func (r *Registry) checkClusterBackend(ctx context.Context, dl *locksv1alpha1.DistributedLock, name string) (*source, error) {
	var b locksv1alpha1.ClusterLockBackend
	if err := r.objects.Get(ctx, types.NamespacedName{Name: name}, &b); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &PolicyError{Field: "spec.backend.clusterBackendRef.name", Reason: locksv1alpha1.ReasonBackendNotFound,
				Message: fmt.Sprintf("ClusterLockBackend %q does not exist: name one the cluster's administrators set up (kubectl get clusterlockbackends)", name)}
		}
		return nil, fmt.Errorf("read ClusterLockBackend %q: %w", name, err)
	}
	if err := ValidateSelectors(&b); err != nil {
		return nil, &PolicyError{Field: "spec.backend.clusterBackendRef.name", Reason: locksv1alpha1.ReasonInvalidBackend,
			Message: fmt.Sprintf("ClusterLockBackend %q cannot be used: %v; its administrators must fix it", name, err)}
	}
	ns, err := r.namespaceLabels(ctx, dl.Namespace)
	if err != nil {
		return nil, err
	}
	if !selects(b.Spec.NamespaceSelector, ns) {
		return nil, &PolicyError{Field: "spec.backend.clusterBackendRef.name", Reason: locksv1alpha1.ReasonBackendNotAllowed,
			Message: fmt.Sprintf("ClusterLockBackend %q may not be used from namespace %q (its spec.namespaceSelector does not select it); no connection was made", name, dl.Namespace)}
	}
	if dl.Spec.Scope == locksv1alpha1.ScopeGlobal && (b.Spec.GlobalScopeNamespaceSelector == nil || !selects(b.Spec.GlobalScopeNamespaceSelector, ns)) {
		return nil, &PolicyError{Field: "spec.scope", Reason: locksv1alpha1.ReasonScopeNotAllowed,
			Message: fmt.Sprintf("Global is not allowed in namespace %q on ClusterLockBackend %q (its spec.globalScopeNamespaceSelector does not select the namespace): use scope Namespace", dl.Namespace, name)}
	}
	if err := checkGlobalKeyPrefixes(dl, &b); err != nil {
		return nil, err
	}
	spec := ClusterSpec(&b)
	if err := spec.Validate(); err != nil {
		return nil, &PolicyError{Field: "spec.backend.clusterBackendRef.name", Reason: locksv1alpha1.ReasonInvalidBackend,
			Message: fmt.Sprintf("ClusterLockBackend %q cannot be used: %v; its administrators must fix it", name, err)}
	}
	return &source{
		id: "ClusterLockBackend/" + name, spec: spec, secretNamespace: r.policy.ClusterResourceNamespace,
		field: fmt.Sprintf("ClusterLockBackend %s: spec.%s", name, spec.Field()),
	}, nil
}

// checkGlobalKeyPrefixes refuses a Global lock with a key that starts with
// none of the ClusterLockBackend's spec.globalKeyPrefixes (empty: any key).
func checkGlobalKeyPrefixes(dl *locksv1alpha1.DistributedLock, b *locksv1alpha1.ClusterLockBackend) error {
	prefixes := b.Spec.GlobalKeyPrefixes
	if dl.Spec.Scope != locksv1alpha1.ScopeGlobal || len(prefixes) == 0 {
		return nil
	}
	for i, key := range dl.Spec.Keys {
		if slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(key, p) }) {
			continue
		}
		quoted := make([]string, len(prefixes))
		for j, p := range prefixes {
			quoted[j] = strconv.Quote(p)
		}
		return &PolicyError{Field: fmt.Sprintf("spec.keys[%d]", i), Reason: locksv1alpha1.ReasonScopeNotAllowed,
			Message: fmt.Sprintf("Global key %q is not allowed on ClusterLockBackend %q: its spec.globalKeyPrefixes allow only keys starting with %s; use such a key, or scope Namespace",
				key, b.Name, strings.Join(quoted, " or "))}
	}
	return nil
}

// ValidateSelectors checks a ClusterLockBackend's namespace selectors; the
// error names the field and says what is wrong.
func ValidateSelectors(b *locksv1alpha1.ClusterLockBackend) error {
	for field, sel := range map[string]*metav1.LabelSelector{
		"spec.namespaceSelector": b.Spec.NamespaceSelector, "spec.globalScopeNamespaceSelector": b.Spec.GlobalScopeNamespaceSelector,
	} {
		if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
	}
	return nil
}

// selects reports whether sel (nil: nothing) selects a namespace with these labels.
func selects(sel *metav1.LabelSelector, nsLabels map[string]string) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false // an invalid selector selects nothing
	}
	return s.Matches(labels.Set(nsLabels))
}

func (r *Registry) namespaceLabels(ctx context.Context, name string) (map[string]string, error) {
	var ns corev1.Namespace
	err := r.objects.Get(ctx, types.NamespacedName{Name: name}, &ns)
	if apierrors.IsNotFound(err) && r.reader != nil {
		// Not in the cache yet (just created): ask the API server.
		err = r.reader.Get(ctx, types.NamespacedName{Name: name}, &ns)
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			// Not "no labels": a negative selector (NotIn, DoesNotExist)
			// would select a namespace the operator has not seen yet.
			return nil, &PolicyError{Field: "metadata.namespace", Reason: locksv1alpha1.ReasonBackendNotAllowed,
				Message: fmt.Sprintf("namespace %q was not found, and its labels decide which backends and scopes it may use; no connection was made", name)}
		}
		return nil, fmt.Errorf("read namespace %q: %w", name, err)
	}
	return ns.Labels, nil
}

// inlineGlobalScope says whether scope Global is allowed with inline endpoints in namespace.
func (r *Registry) inlineGlobalScope(ctx context.Context, namespace string) error {
	g := r.policy.GlobalScope
	if g.AllowAll {
		return nil
	}
	if g.NamespaceLabel != "" {
		ns, err := r.namespaceLabels(ctx, namespace)
		var unseen *PolicyError
		if errors.As(err, &unseen) {
			// A positive check: a namespace not seen yet is not labelled.
			ns, err = nil, nil
		}
		if err != nil {
			return err
		}
		if ns[g.NamespaceLabel] == "true" {
			return nil
		}
		return &PolicyError{Field: "spec.scope", Reason: locksv1alpha1.ReasonScopeNotAllowed,
			Message: fmt.Sprintf("Global is not allowed in namespace %q: the cluster's administrators allow it by labelling the namespace %s=true; or use scope Namespace", namespace, g.NamespaceLabel)}
	}
	return &PolicyError{Field: "spec.scope", Reason: locksv1alpha1.ReasonScopeNotAllowed,
		Message: fmt.Sprintf("Global is not allowed in namespace %q: the operator runs without --allow-global-scope; use scope Namespace", namespace)}
}
