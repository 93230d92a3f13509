package manager

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
)

// Without --cluster-name, a new installation names its cluster after the
// kube-system namespace's UID, records the name in the owner-key Secret and
// every replica reads it back; an installation whose Secret predates the
// record keeps "default", so that its leases stay its own.
func TestClusterNameIsRecordedOnce(t *testing.T) {
	env := kubetest.Start(t)
	ctx := context.Background()
	var ks corev1.Namespace
	if err := env.Client.Get(ctx, types.NamespacedName{Name: "kube-system"}, &ks); err != nil {
		t.Fatal(err)
	}
	want := "cluster-" + strings.ReplaceAll(string(ks.UID), "-", "")[:12]

	nn := types.NamespacedName{Namespace: "default", Name: "lockwarden-owner-key"}
	first, err := holder.LoadOrCreateIdentity(ctx, env.Client, nn, func(ctx context.Context) (string, error) { return clusterNameFromUID(ctx, env.Client) })
	if err != nil {
		t.Fatal(err)
	}
	if first.Cluster != want {
		t.Fatalf("a new installation is named %q; want %q, after the kube-system namespace's UID %s", first.Cluster, want, ks.UID)
	}
	var s corev1.Secret
	if err := env.Client.Get(ctx, nn, &s); err != nil {
		t.Fatal(err)
	}
	if got := string(s.Data[holder.ClusterField]); got != want {
		t.Fatalf("the owner-key Secret records %q as the cluster name; want %q", got, want)
	}
	again, err := holder.LoadOrCreateIdentity(ctx, env.Client, nn, func(context.Context) (string, error) {
		t.Fatal("a replica that finds the Secret must not name the cluster again")
		return "", nil
	})
	if err != nil || again.Cluster != want || !bytes.Equal(again.Key, first.Key) {
		t.Fatalf("another replica reads cluster %q (err %v), same key %v; want %q and the same key", again.Cluster, err, bytes.Equal(again.Key, first.Key), want)
	}

	legacy := types.NamespacedName{Namespace: "default", Name: "owner-key-from-an-older-release"}
	if err := env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: legacy.Namespace, Name: legacy.Name},
		Data: map[string][]byte{holder.KeyField: bytes.Repeat([]byte{7}, holder.MinKeyLen)}}); err != nil {
		t.Fatal(err)
	}
	old, err := holder.LoadOrCreateIdentity(ctx, env.Client, legacy, func(context.Context) (string, error) { return want, nil })
	if err != nil || old.Cluster != holder.LegacyClusterName {
		t.Fatalf("an installation from before the record is named %q (err %v); want %q, its old default", old.Cluster, err, holder.LegacyClusterName)
	}
}
