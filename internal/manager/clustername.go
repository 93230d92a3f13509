package manager

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kubeSystemWait bounds how long a new installation waits for the
// kube-system namespace. The API server creates it a moment after it starts
// serving, so an operator started with a fresh control plane (make dev, a
// test) can ask before it exists.
var kubeSystemWait = time.Minute

// clusterNameFromUID names a new installation's cluster after the
// kube-system namespace's UID: the same for every replica and every
// reinstall in this cluster, different in every other, so that clusters
// sharing a store do not share a name by default ("default" did).
func clusterNameFromUID(ctx context.Context, c client.Reader) (string, error) {
	var ns corev1.Namespace
	var last error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, kubeSystemWait, true, func(ctx context.Context) (bool, error) {
		last = c.Get(ctx, types.NamespacedName{Name: "kube-system"}, &ns)
		if apierrors.IsNotFound(last) {
			return false, nil // not created yet
		}
		return last == nil, last
	})
	if err != nil {
		if last == nil {
			last = err
		}
		return "", fmt.Errorf("name the cluster after the kube-system namespace's UID: %w; or set --cluster-name", last)
	}
	uid := strings.ToLower(strings.ReplaceAll(string(ns.UID), "-", ""))
	if len(uid) < 12 {
		return "", fmt.Errorf("the kube-system namespace's UID %q is too short to name the cluster after; set --cluster-name", ns.UID)
	}
	return "cluster-" + uid[:12], nil
}
