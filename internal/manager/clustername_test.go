package manager

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// lateKubeSystem answers NotFound for kube-system until its first calls
// have passed, as a freshly started API server does before it creates the
// namespace; a real one cannot be made to lose that race on demand.
type lateKubeSystem struct {
	client.Reader
	missing int
	calls   int
	fail    error
}

func (r *lateKubeSystem) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	r.calls++
	if r.fail != nil {
		return r.fail
	}
	if r.calls <= r.missing {
		return apierrors.NewNotFound(corev1.Resource("namespaces"), key.Name)
	}
	obj.(*corev1.Namespace).UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	return nil
}

func TestClusterNameWaitsForKubeSystem(t *testing.T) {
	ctx := context.Background()
	late := &lateKubeSystem{missing: 3}
	name, err := clusterNameFromUID(ctx, late)
	if err != nil || name != "cluster-0f1e2d3c4b5a" {
		t.Fatalf("with kube-system created after %d lookups: name %q, err %v; want cluster-0f1e2d3c4b5a", late.missing, name, err)
	}

	denied := &lateKubeSystem{fail: apierrors.NewForbidden(corev1.Resource("namespaces"), "kube-system", errors.New("no RBAC"))}
	if _, err := clusterNameFromUID(ctx, denied); err == nil || denied.calls != 1 || !strings.Contains(err.Error(), "--cluster-name") {
		t.Fatalf("a Forbidden lookup: err %v after %d calls; want one call and an error that points at --cluster-name", err, denied.calls)
	}

	defer func(d time.Duration) { kubeSystemWait = d }(kubeSystemWait)
	kubeSystemWait = time.Second
	never := &lateKubeSystem{missing: 1 << 30}
	if _, err := clusterNameFromUID(ctx, never); err == nil || !apierrors.IsNotFound(errors.Unwrap(err)) && !strings.Contains(err.Error(), "not found") {
		t.Fatalf("kube-system never appearing: err %v; want the NotFound, with --cluster-name as the way out", err)
	}
}
