package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Gated Pods hold locks for themselves (holder kind Pod) or for their
// Deployment or StatefulSet (holder mode Workload); status shows each as it
// shows a Job: its identity, with "+N" for the other holders of a semaphore.
func TestStatusShowsPodAndWorkloadHolders(t *testing.T) {
	lock := func(name string, maxHolders int32, holders ...locksv1alpha1.HolderStatus) locksv1alpha1.DistributedLock {
		dl := *testLock(name)
		dl.CreationTimestamp = metav1.NewTime(now.Add(-72 * time.Hour))
		dl.Spec.MaxHolders = maxHolders
		if len(holders) > 0 {
			dl.Status.Holder = &holders[0]
			dl.Status.FencingToken = holders[0].FencingToken
			dl.Status.Holders = holders
			dl.Status.HolderCount = ptr.To(int32(len(holders)))
		}
		return dl
	}
	holder := func(cluster, kind, name, uid string, fence int64) locksv1alpha1.HolderStatus {
		return locksv1alpha1.HolderStatus{Identity: cluster + "/" + ns + "/" + kind + "/" + name + "/" + uid, Cluster: cluster, Kind: kind, Namespace: ns, Name: name, FencingToken: fence}
	}
	locks := []locksv1alpha1.DistributedLock{
		lock("ledger", 1, holder("cluster-a", "StatefulSet", "ledger", "0c6d1", 7)),
		lock("payments", 1, holder("cluster-a", "Pod", "payments-5d8f7c9b4-q7t2m", "3f9a1", 41)),
		lock("web", 1, holder("cluster-b", "Deployment", "web", "9e8d7", 12)),
		lock("workers", 3, holder("cluster-a", "Pod", "workers-0", "aaaaa", 21), holder("cluster-b", "Pod", "workers-0", "bbbbb", 22), holder("cluster-a", "Pod", "workers-1", "ccccc", 23)),
	}
	var out strings.Builder
	if err := printStatusTable(&out, locks, false, false, now); err != nil {
		t.Fatal(err)
	}
	var got [][]string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		got = append(got, strings.Fields(l))
	}
	want := [][]string{
		{"NAME", "KEYS", "HOLDER", "FENCE", "QUEUE", "BACKEND", "READY", "AGE"},
		{"ledger", "ledger/main", "cluster-a/team-a/StatefulSet/ledger/0c6d1", "7", "0", "ClusterLockBackend/shared-redis", "Unknown", "3d"},
		{"payments", "payments/main", "cluster-a/team-a/Pod/payments-5d8f7c9b4-q7t2m/3f9a1", "41", "0", "ClusterLockBackend/shared-redis", "Unknown", "3d"},
		{"web", "web/main", "cluster-b/team-a/Deployment/web/9e8d7", "12", "0", "ClusterLockBackend/shared-redis", "Unknown", "3d"},
		{"workers", "workers/main", "cluster-a/team-a/Pod/workers-0/aaaaa", "+2", "21", "0", "ClusterLockBackend/shared-redis", "Unknown", "3d"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status table (-want,+got):\n%s", diff)
	}
}
