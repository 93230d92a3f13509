package holder

import (
	"context"
	"crypto/rand"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KeyField is the data key of the owner-key Secret.
const KeyField = "owner-key"

// LoadOrCreateKey returns the owner key stored in the Secret nn, creating the
// Secret with a fresh random key when it does not exist. Every replica of the
// operator reads the same Secret, so every replica derives the same tokens.
func LoadOrCreateKey(ctx context.Context, c client.Client, nn types.NamespacedName) ([]byte, error) {
	for range 2 {
		var s corev1.Secret
		err := c.Get(ctx, nn, &s)
		if err == nil {
			key := s.Data[KeyField]
			if len(key) < MinKeyLen {
				return nil, fmt.Errorf("owner-key Secret %s key %q holds %d bytes, at least %d are required: delete the Secret to have a new key made (held leases are then lost)", nn, KeyField, len(key), MinKeyLen)
			}
			return key, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("read owner-key Secret %s: %w", nn, err)
		}
		key := make([]byte, MinKeyLen)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name, Labels: map[string]string{"app.kubernetes.io/name": "lockwarden"}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{KeyField: key},
		}
		err = c.Create(ctx, &s)
		if err == nil {
			return key, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create owner-key Secret %s: %w", nn, err)
		}
		// Another replica created it first: read theirs.
	}
	return nil, fmt.Errorf("owner-key Secret %s could not be read or created", nn)
}
