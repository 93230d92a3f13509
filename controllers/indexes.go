package controllers

import (
	"context"

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

// backendKeyIndexValues are the indexBackendKey values of dl: one per key.
func backendKeyIndexValues(dl *locksv1alpha1.DistributedLock) []string {
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
