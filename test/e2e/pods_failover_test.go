//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/devcluster"
)

// peerClusterName is the second cluster's --cluster-name.
const peerClusterName = "e2e-peer"

// failoverTTL is the TTL of the lock the failover waits on.
const failoverTTL = 6

// startPeerCluster starts a second cluster, with its own control plane and
// operator (--cluster-name peerClusterName) but the suite cluster's Redis:
// two clusters of one fleet sharing a store. It reuses the suite's binaries
// and stops at the end of the test.
func startPeerCluster(t *testing.T) *devcluster.Cluster {
	t.Helper()
	begin := time.Now()
	dir, err := os.MkdirTemp("", "lockwarden-e2e-peer-")
	if err != nil {
		t.Fatal(err)
	}
	opts := cluster.Options()
	opts.Dir = dir
	opts.ExternalRedis = cluster.RedisAddrs()
	opts.Store = devcluster.StoreRedis
	opts.ClusterName = peerClusterName
	opts.Logf = func(format string, args ...any) { t.Logf("[peer] "+format, args...) }
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	peer, err := devcluster.Start(ctx, opts)
	if err != nil {
		t.Fatalf("start the peer cluster: %v (logs in %s)", err, dir)
	}
	t.Cleanup(func() {
		peer.Stop()
		if refused := refusals(peer.LogPath("lockwarden")); len(refused) > 0 {
			t.Errorf("the peer's API server refused its operator %d times:\n%s", len(refused), strings.Join(refused, "\n"))
		}
		if t.Failed() || os.Getenv("E2E_KEEP") != "" {
			t.Logf("the peer cluster's logs are in %s", peer.LogDir())
			return
		}
		_ = os.RemoveAll(dir)
	})
	t.Logf("peer cluster %s ready in %v, sharing Redis %v", peerClusterName, time.Since(begin).Round(100*time.Millisecond), opts.ExternalRedis)
	return peer
}

// fleetObjects creates, through c, the namespace ns, the lock fleet on the
// cluster's dev-redis backend (the shared Redis) with explicit keys, so that
// the same lock in both clusters names the same store keys, and a
// Deployment of 2 whose own metadata names the lock in Workload mode.
func fleetObjects(t *testing.T, c client.Client, ns string) {
	t.Helper()
	ctx := t.Context()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	dl := newPodLock(ns, "fleet", "fleet/singleton", 1, failoverTTL)
	dl.Spec.OnLost = locksv1alpha1.OnLostTerminate
	if err := c.Create(ctx, dl); err != nil {
		t.Fatal(err)
	}
	d := newLockedDeployment(ns, "fleet", "fleet", 2)
	delete(d.Spec.Template.Annotations, locksv1alpha1.AnnotationLock)
	d.Annotations = map[string]string{locksv1alpha1.AnnotationLock: "fleet", locksv1alpha1.AnnotationHolderMode: string(locksv1alpha1.HolderModeWorkload)}
	if err := c.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
}

// TestPodWorkloadFailoverAcrossClusters runs the same Deployment, in
// Workload mode, in two clusters that share one Redis: only one cluster's
// Pods run. The active cluster's operator is killed with SIGKILL: the
// standby cluster's Pods are ungated within TTL + 2 s, with a larger
// fencing token. The killed operator is started again: it finds its lease
// lost and evicts its cluster's Pods (onLost Terminate), whose replacements
// stay gated; no second holder appears.
//
// Overlap (samples in which both clusters have an ungated Pod) is counted by
// phase. While both operators run it must be 0. After the kill, the dead
// operator's Pods run on with the older token until it is back (nothing else
// in their cluster can stop them: that is what the fencing token is for);
// those samples are reported, not failed. After its Pods are gone it must be
// 0 again.
func TestPodWorkloadFailoverAcrossClusters(t *testing.T) {
	peer := startPeerCluster(t)
	const ns = "e2e-pod-fleet"
	dumpOnFailure(t, cluster.Client, ns)
	dumpOnFailure(t, peer.Client, ns)
	const (
		phaseBoth      = "both operators running"
		phaseKilled    = "active operator killed"
		phaseRestarted = "killed operator restarted"
		phaseRecovered = "stale Pods gone"
	)
	strict := func(sm sample) []string {
		if sm.phase == phaseKilled || sm.phase == phaseRestarted {
			return atMostHolders(1, false)(sample{lockHolders: sm.lockHolders})
		}
		if n := clustersHolding(sm.pods, false); n > 1 {
			return []string{fmt.Sprintf("both clusters have holders: %v", describeHolders(sm.pods, false))}
		}
		return nil
	}
	sampler := samplePods(t, strict,
		podSource{cluster: devcluster.ClusterName, client: cluster.Client, config: cluster.Config, namespace: ns, lock: "fleet"},
		podSource{cluster: peerClusterName, client: peer.Client, config: peer.Config, namespace: ns, lock: "fleet"})
	sampler.setPhase(phaseBoth)
	overlap := func(sm sample) bool { return clustersHolding(sm.pods, false) > 1 }

	// The peer cluster's Deployment comes first and holds.
	fleetObjects(t, peer.Client, ns)
	first := waitClusterHolds(t, sampler, peerClusterName, 2)
	t.Logf("%s holds: its Pods run with token %d", peerClusterName, first)
	checkWorkloadHolder(t, peer.Client, ns, peerClusterName, first)

	// The same Deployment in the suite cluster waits behind the gate, for
	// longer than a few renewals of the peer's lease.
	fleetObjects(t, cluster.Client, ns)
	watchUntil := time.Now().Add(2 * failoverTTL * time.Second)
	waitFor(t, 2*failoverTTL*time.Second+30*time.Second, "the suite cluster's Pods to wait gated while the peer holds", func(context.Context) (bool, error) {
		sm := sampler.last()
		gatedHere := 0
		for _, p := range sm.pods {
			if p.cluster == devcluster.ClusterName && p.gated && !p.terminating {
				gatedHere++
			}
		}
		return gatedHere == 2 && time.Now().After(watchUntil), nil
	})

	// kill -9 the active (peer) operator: the suite cluster takes over once
	// the peer's lease expires.
	sampler.setPhase(phaseKilled)
	killed := time.Now()
	peer.KillOperator()
	second := waitClusterHolds(t, sampler, devcluster.ClusterName, 2)
	var took time.Duration
	for _, p := range sampler.last().pods {
		if p.cluster == devcluster.ClusterName && p.holds(false) {
			at, _ := sampler.heldSince(p.uid)
			if d := at.Sub(killed); took == 0 || d < took {
				took = d
			}
		}
	}
	t.Logf("failover: the suite cluster's Pods were ungated %v after the peer's operator was killed (TTL %ds), token %d -> %d",
		took.Round(time.Millisecond), failoverTTL, first, second)
	if limit := failoverTTL*time.Second + 2*time.Second; took > limit {
		t.Errorf("failover took %v, more than TTL + 2 s = %v", took, limit)
	}
	if second <= first {
		t.Errorf("the suite cluster holds with token %d, not above the peer's %d", second, first)
	}
	checkWorkloadHolder(t, cluster.Client, ns, devcluster.ClusterName, second)

	// The killed operator comes back: its lease is lost, its Pods are
	// evicted and their replacements wait.
	sampler.setPhase(phaseRestarted)
	restarted := time.Now()
	if err := peer.StartOperator(t.Context()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the peer's stale Pods to be gone and their replacements gated", func(context.Context) (bool, error) {
		gatedThere, stale := 0, 0
		for _, p := range sampler.last().pods {
			if p.cluster != peerClusterName {
				continue
			}
			switch {
			case p.gated:
				gatedThere++
			case !p.finished:
				stale++
			}
		}
		return stale == 0 && gatedThere == 2, nil
	})
	t.Logf("the restarted peer operator stopped its stale Pods within %v of its start", time.Since(restarted).Round(100*time.Millisecond))
	sampler.setPhase(phaseRecovered)
	watchUntil = time.Now().Add(2 * failoverTTL * time.Second)
	waitFor(t, 2*failoverTTL*time.Second+10*time.Second, "a quiet period after the failover", func(context.Context) (bool, error) {
		return time.Now().After(watchUntil), nil
	})
	checkWorkloadHolder(t, cluster.Client, ns, devcluster.ClusterName, second)
	checkWorkloadHolder(t, peer.Client, ns, devcluster.ClusterName, second)

	for _, phase := range []string{phaseBoth, phaseKilled, phaseRestarted, phaseRecovered} {
		n, of := sampler.count(phase, overlap)
		t.Logf("overlap samples (both clusters ungated) while %s: %d of %d", phase, n, of)
	}
	all, of := sampler.count("", overlap)
	fmt.Printf("BENCHMARK-ROW | Workload failover across two clusters sharing Redis (kill -9 of the active operator, TTL %d s) | standby ungated after %v | token %d -> %d | overlap samples while both operators run: %d; %d of %d samples in all, while the dead operator's Pods ran on |\n",
		failoverTTL, took.Round(10*time.Millisecond), first, second, func() int { n, _ := sampler.count(phaseBoth, overlap); return n }(), all, of)
}

// waitClusterHolds waits until every one of want Pods in clusterName holds
// (ungated, running, with one shared token) and returns the token.
func waitClusterHolds(t *testing.T, sampler *podSampler, clusterName string, want int) int64 {
	t.Helper()
	var token int64
	waitFor(t, 60*time.Second, fmt.Sprintf("%d Pods of %s to run ungated", want, clusterName), func(context.Context) (bool, error) {
		n := 0
		token = 0
		for _, p := range sampler.last().pods {
			if p.cluster != clusterName || !p.holds(false) || p.phase != corev1.PodRunning {
				continue
			}
			if token != 0 && p.token != token {
				return false, fmt.Errorf("the Pods of %s hold different tokens: %d and %d", clusterName, token, p.token)
			}
			token = p.token
			n++
		}
		return n == want && token > 0, nil
	})
	return token
}

// checkWorkloadHolder checks that the lock, as c's cluster shows it, has
// one holder: of cluster holderCluster, with token, and (shown in its own
// cluster) of kind Deployment.
func checkWorkloadHolder(t *testing.T, c client.Client, ns, holderCluster string, token int64) {
	t.Helper()
	waitFor(t, 15*time.Second, fmt.Sprintf("the lock to show the Deployment of %s as its one holder", holderCluster), func(ctx context.Context) (bool, error) {
		var dl locksv1alpha1.DistributedLock
		if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "fleet"}, &dl); err != nil {
			return false, err
		}
		if len(dl.Status.Holders) != 1 {
			return false, nil
		}
		h := dl.Status.Holders[0]
		own := c == cluster.Client && holderCluster == devcluster.ClusterName || c != cluster.Client && holderCluster == peerClusterName
		return h.Cluster == holderCluster && h.FencingToken == token && (!own || h.Kind == "Deployment" && h.Name == "fleet"), nil
	})
}
