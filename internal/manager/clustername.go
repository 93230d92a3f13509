package manager

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// clusterNameFromUID names a new installation's cluster after the
// kube-system namespace's UID: the same for every replica and every
// reinstall in this cluster, different in every other, so that clusters
// sharing a store do not share a name by default ("default" did).
func clusterNameFromUID(ctx context.Context, c client.Reader) (string, error) {
	var ns corev1.Namespace
	if err := c.Get(ctx, types.NamespacedName{Name: "kube-system"}, &ns); err != nil {
		return "", fmt.Errorf("name the cluster after the kube-system namespace's UID: %w; or set --cluster-name", err)
	}
	uid := strings.ToLower(strings.ReplaceAll(string(ns.UID), "-", ""))
	if len(uid) < 12 {
		return "", fmt.Errorf("the kube-system namespace's UID %q is too short to name the cluster after; set --cluster-name", ns.UID)
	}
	return "cluster-" + uid[:12], nil
}
