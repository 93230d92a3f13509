package backend

import (
	"fmt"
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
