package controllers

import (
	"context"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
)

// Field indexes of the manager's cache.
const (
	// indexBackend indexes DistributedLocks by backend ID.
	indexBackend = "lockwarden.backend"
	// indexBackendKey indexes DistributedLocks by backend ID and backend-side key.
	indexBackendKey = "lockwarden.backendKey"
)

// IndexFields registers every field index the reconcilers look things up by.
func IndexFields(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &locksv1alpha1.DistributedLock{}, indexBackend, func(o client.Object) []string {
		return []string{backend.LockBackendID(o.(*locksv1alpha1.DistributedLock))}
	}); err != nil {
		return err
	}
	return idx.IndexField(ctx, &locksv1alpha1.DistributedLock{}, indexBackendKey, func(o client.Object) []string {
		return backendKeyIndexValues(o.(*locksv1alpha1.DistributedLock))
	})
}

// backendKeyIndexValues are the indexBackendKey values of dl: one per key;
// for a lock that derives keys, its scope's prefix (backend.ScopePrefix),
// under which every key it derives lies.
func backendKeyIndexValues(dl *locksv1alpha1.DistributedLock) []string {
	if dl.Spec.KeyFrom != nil {
		return backendKeyValues(backend.LockBackendID(dl), backend.EngineKey(dl.Namespace, dl.Spec.Scope, ""))
	}
	return backendKeyValues(backend.LockBackendID(dl), backend.EngineKeys(dl)...)
}

// backendKeyValues are indexBackendKey values of keys on the backend id.
func backendKeyValues(id string, keys ...string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = id + "\x00" + k
	}
	return out
}

// LeanJob is the manager's cache transform of gated Jobs: it drops their
// managedFields and their pod template's spec (containers, volumes...),
// which nothing in the operator reads, so that a tenant's large Jobs do not
// grow every replica. The operator changes Jobs only by patches computed
// between two such copies, which leave the template's spec as it is; the
// template's metadata (where the fencing token goes) is kept.
func LeanJob(obj any) (any, error) {
	obj, err := cache.TransformStripManagedFields()(obj)
	if err != nil {
		return obj, err
	}
	if job, ok := obj.(*batchv1.Job); ok {
		job.Spec.Template.Spec = corev1.PodSpec{}
	}
	return obj, nil
}
