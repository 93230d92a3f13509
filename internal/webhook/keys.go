package webhook

import (
	"context"
	"errors"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/keyfrom"
)

// deriveKey gives a workload of dl its key when dl derives keys
// (spec.keyFrom), or "" when dl has fixed keys. It refuses the workload
// when the expression fails for it, when the key is outside what the
// backend allows (a Global lock's key prefixes), or when the key would be
// one more than the lock's maxKeys in use in this cluster.
func deriveKey(ctx context.Context, l lockLookup, gk schema.GroupKind, objName string, dl *locksv1alpha1.DistributedLock, w keyfrom.Workload, path *field.Path, source string) (string, error) {
	if dl.Spec.KeyFrom == nil {
		return "", nil
	}
	invalid := func(msg string) error {
		return apierrors.NewInvalid(gk, objName, field.ErrorList{field.Invalid(path.Key(locksv1alpha1.AnnotationLock), dl.Name, source+msg)})
	}
	p, err := keyfrom.Compile(dl.Spec.KeyFrom)
	if err != nil {
		return "", invalid(fmt.Sprintf("DistributedLock %q cannot derive keys: %v", dl.Name, err))
	}
	key, err := p.Key(dl.Name, w)
	if err != nil {
		return "", invalid(err.Error())
	}
	if l.check != nil {
		// The backend's policy judges the derived key as it would a fixed one.
		fixed := dl.DeepCopy()
		fixed.Spec.Keys, fixed.Spec.KeyFrom = []string{key}, nil
		var pe *backend.PolicyError
		switch err := l.check(ctx, fixed); {
		case errors.As(err, &pe):
			return "", invalid(fmt.Sprintf("DistributedLock %q derived the key %q, which it may not use: %s", dl.Name, key, pe.Message))
		case err != nil:
			return "", apierrors.NewInternalError(fmt.Errorf("check the key %q of DistributedLock %s/%s: %w", key, dl.Namespace, dl.Name, err))
		}
	}
	inUse, err := keyfrom.InUse(ctx, l.reader, dl)
	if err != nil {
		return "", apierrors.NewInternalError(err)
	}
	if limit := keyfrom.MaxKeys(dl); !slices.Contains(inUse, key) && len(inUse) >= limit {
		shown := inUse
		if len(shown) > 5 {
			shown = append(slices.Clone(shown[:5]), "...")
		}
		return "", invalid(fmt.Sprintf("DistributedLock %q already has %d derived keys in use (spec.maxKeys %d: %v) and this workload would add %q: wait until the workloads of one key end, or raise spec.maxKeys",
			dl.Name, len(inUse), limit, shown, key))
	}
	return key, nil
}

// setKey records key on a workload's annotations ("" removes a key that
// its creator wrote: only lockwarden gives keys).
func setKey(annotations map[string]string, key string) map[string]string {
	if key == "" {
		delete(annotations, locksv1alpha1.AnnotationKey)
		return annotations
	}
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[locksv1alpha1.AnnotationKey] = key
	return annotations
}
