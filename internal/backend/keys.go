package backend

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// KeyPrefix is prepended to every Redis key lockwarden writes. (The other
// stores keep their data apart by their own means: a schema, a root znode,
// a key prefix.)
const KeyPrefix = "lockwarden:"

// ID names a backend by what decides which keys it holds (mode, endpoints,
// database), not by its credentials: locks with equal IDs share keys.
func ID(rb *locksv1alpha1.RedisBackend) string {
	if rb == nil {
		return ""
	}
	endpoints := slices.Clone(rb.Endpoints)
	slices.Sort(endpoints)
	mode := "standalone"
	switch {
	case rb.Sentinel != nil:
		mode = "sentinel:" + rb.Sentinel.MasterName
	case len(endpoints) > 1:
		mode = "redlock"
	}
	return fmt.Sprintf("%s/%s/db%d", mode, strings.Join(endpoints, ","), rb.DB)
}

// EngineKeys returns the store-side names of dl's keys: prefixed with the
// namespace unless the scope is Global, so that namespaces never share keys
// by accident.
func EngineKeys(dl *locksv1alpha1.DistributedLock) []string {
	out := make([]string, len(dl.Spec.Keys))
	for i, k := range dl.Spec.Keys {
		out[i] = EngineKey(dl.Namespace, dl.Spec.Scope, k)
	}
	return out
}

// EngineKey returns the store-side name of one key.
func EngineKey(namespace string, scope locksv1alpha1.Scope, key string) string {
	if scope == locksv1alpha1.ScopeGlobal {
		return "global/" + key
	}
	return "ns/" + namespace + "/" + key
}

// WorkloadKeys returns the store-side keys a workload of dl acquires: dl's
// keys, or with spec.keyFrom the one key its admission derived and recorded
// in its lockwarden.io/key annotation, in dl's scope (a Namespace lock's
// derived keys stay in its namespace, whatever the workload's labels say).
// The error says why a workload of a keyFrom lock has no usable key.
func WorkloadKeys(dl *locksv1alpha1.DistributedLock, annotations map[string]string) ([]string, error) {
	if dl.Spec.KeyFrom == nil {
		return EngineKeys(dl), nil
	}
	key, ok := annotations[locksv1alpha1.AnnotationKey]
	if !ok {
		return nil, fmt.Errorf("it has no %s annotation: it was admitted before DistributedLock %s derived its keys; create it again", locksv1alpha1.AnnotationKey, dl.Name)
	}
	if err := ValidKey(key); err != nil {
		return nil, fmt.Errorf("its %s annotation %q is %w", locksv1alpha1.AnnotationKey, key, err)
	}
	return []string{EngineKey(dl.Namespace, dl.Spec.Scope, key)}, nil
}

// keyPattern is spec.keys' item pattern.
var keyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/:-]*$`)

// MaxKeyLength bounds a key, fixed or derived.
const MaxKeyLength = 200

// ValidKey checks a derived key as the API checks spec.keys.
func ValidKey(key string) error {
	switch {
	case key == "":
		return errors.New("empty; keys are 1 to 200 characters")
	case len(key) > MaxKeyLength:
		return fmt.Errorf("%d characters long; keys are at most %d", len(key), MaxKeyLength)
	case !keyPattern.MatchString(key):
		return errors.New("not a valid key: keys are letters, digits and the characters . _ / : - (starting with a letter or digit)")
	}
	return nil
}

// LaneKey returns the derived key of a store-side key of dl (a lock with
// spec.keyFrom): the engine key without dl's scope prefix, and whether
// engineKey is in dl's scope at all.
func LaneKey(dl *locksv1alpha1.DistributedLock, engineKey string) (string, bool) {
	prefix := EngineKey(dl.Namespace, dl.Spec.Scope, "")
	if !strings.HasPrefix(engineKey, prefix) {
		return "", false
	}
	return engineKey[len(prefix):], true
}

// ScopePrefix returns the scope prefix of a store-side key (EngineKey with
// an empty key): "ns/<namespace>/" or "global/".
func ScopePrefix(engineKey string) (string, bool) {
	if strings.HasPrefix(engineKey, "global/") {
		return "global/", true
	}
	rest, ok := strings.CutPrefix(engineKey, "ns/")
	if !ok {
		return "", false
	}
	ns, _, ok := strings.Cut(rest, "/")
	if !ok {
		return "", false
	}
	return "ns/" + ns + "/", true
}
