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

// Data keys of the owner-key Secret.
const (
	// KeyField holds the owner key.
	KeyField = "owner-key"
	// ClusterField holds the cluster name chosen when the Secret was
	// created, used when --cluster-name is not set.
	ClusterField = "cluster-name"
)

// LegacyClusterName is the cluster name of an installation whose owner-key
// Secret predates ClusterField: the old default of --cluster-name. Such an
// installation keeps it, so that the leases it holds stay its own across
// the upgrade (the name is part of every holder record and owner token).
const LegacyClusterName = "default"

// Identity is what the owner-key Secret gives every replica alike: the key
// owner tokens are derived from, and the name of the cluster.
type Identity struct {
	Key     []byte
	Cluster string
}

// LoadOrCreateIdentity returns the identity stored in the Secret nn,
// creating the Secret when it does not exist, with a fresh random key and
// the cluster name newCluster returns. Every replica of the operator reads
// the same Secret, so every replica derives the same tokens and records the
// same cluster name.
func LoadOrCreateIdentity(ctx context.Context, c client.Client, nn types.NamespacedName, newCluster func(context.Context) (string, error)) (Identity, error) {
	for range 2 {
		var s corev1.Secret
		err := c.Get(ctx, nn, &s)
		if err == nil {
			key := s.Data[KeyField]
			if len(key) < MinKeyLen {
				return Identity{}, fmt.Errorf("owner-key Secret %s key %q holds %d bytes, at least %d are required: delete the Secret to have a new key made (held leases are then lost)", nn, KeyField, len(key), MinKeyLen)
			}
			cluster := string(s.Data[ClusterField])
			if cluster == "" {
				cluster = LegacyClusterName
			}
			return Identity{Key: key, Cluster: cluster}, nil
		}
		if !apierrors.IsNotFound(err) {
			return Identity{}, fmt.Errorf("read owner-key Secret %s: %w", nn, err)
		}
		key := make([]byte, MinKeyLen)
		if _, err := rand.Read(key); err != nil {
			return Identity{}, err
		}
		cluster, err := newCluster(ctx)
		if err != nil {
			return Identity{}, err
		}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: nn.Namespace, Name: nn.Name, Labels: map[string]string{"app.kubernetes.io/name": "lockwarden"}},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{KeyField: key, ClusterField: []byte(cluster)},
		}
		err = c.Create(ctx, &s)
		if err == nil {
			return Identity{Key: key, Cluster: cluster}, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return Identity{}, fmt.Errorf("create owner-key Secret %s: %w", nn, err)
		}
		// Another replica created it first: read theirs.
	}
	return Identity{}, fmt.Errorf("owner-key Secret %s could not be read or created", nn)
}
