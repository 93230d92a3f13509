//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// samplePeriod is how often a podSampler lists the Pods it watches.
const samplePeriod = 100 * time.Millisecond

// podView is what one sample saw of one Pod.
type podView struct {
	cluster, name string
	uid           types.UID
	// gated: the Pod still has the scheduling gate lockwarden.io/lock.
	gated bool
	// terminating: the Pod is being deleted; its containers may run until
	// graceEnd (its deletionTimestamp: the end of its grace period, when the
	// kubelet kills what still runs). The API shows it to the second.
	terminating bool
	graceEnd    time.Time
	// at is when the sample was taken.
	at time.Time
	// finished: phase Succeeded or Failed.
	finished bool
	phase    corev1.PodPhase
	// token is the Pod's lockwarden.io/fencing-token annotation (0: none).
	token int64
	// hash is the Pod's pod-template-hash label: which ReplicaSet it belongs to.
	hash string
}

// holds reports whether the Pod counts as a holder: it is not gated, has not
// finished, and, when it is terminating, its grace period has not ended. A
// terminating Pod does not count at all with terminatingReleases, which is
// how the handover Terminating documents it (the old Pod releases its lease
// as soon as it starts terminating).
func (p podView) holds(terminatingReleases bool) bool {
	if p.gated || p.finished {
		return false
	}
	if p.terminating {
		return !terminatingReleases && p.at.Before(p.graceEnd)
	}
	return true
}

func (p podView) String() string {
	var state []string
	if p.gated {
		state = append(state, "gated")
	}
	if p.terminating {
		state = append(state, "terminating")
	}
	state = append(state, string(p.phase))
	return fmt.Sprintf("%s/%s (%s, token %d)", p.cluster, p.name, strings.Join(state, ", "), p.token)
}

// viewPod turns a Pod, as listed at, into the sampler's view of it.
func viewPod(clusterName string, pod *corev1.Pod, at time.Time) podView {
	token, _ := strconv.ParseInt(pod.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
	var graceEnd time.Time
	if pod.DeletionTimestamp != nil {
		graceEnd = pod.DeletionTimestamp.Time
	}
	return podView{
		cluster: clusterName, name: pod.Name, uid: pod.UID, at: at, graceEnd: graceEnd,
		gated: slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
			return g.Name == locksv1alpha1.SchedulingGate
		}),
		terminating: pod.DeletionTimestamp != nil,
		finished:    pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed,
		phase:       pod.Status.Phase,
		token:       token,
		hash:        pod.Labels["pod-template-hash"],
	}
}

// holders returns the Pods of a sample that count as holders, by cluster.
func holders(pods []podView, terminatingReleases bool) map[string][]podView {
	out := map[string][]podView{}
	for _, p := range pods {
		if p.holds(terminatingReleases) {
			out[p.cluster] = append(out[p.cluster], p)
		}
	}
	return out
}

// holderCount returns how many Pods of a sample count as holders.
func holderCount(pods []podView, terminatingReleases bool) int {
	n := 0
	for _, ps := range holders(pods, terminatingReleases) {
		n += len(ps)
	}
	return n
}

// clustersHolding returns how many clusters have a holder in a sample: more
// than one is an overlap between clusters.
func clustersHolding(pods []podView, terminatingReleases bool) int {
	return len(holders(pods, terminatingReleases))
}

// podSource is one namespace, in one cluster, that a sampler lists, with the
// lock whose status.holderCount it reads at each sample. With config, the
// sampler also watches the namespace's Pods, to time when each Pod starts
// holding and finishes more closely than its samples can.
type podSource struct {
	cluster   string
	client    client.Client
	config    *rest.Config
	namespace string
	lock      string
}

// sample is what one tick of the sampler saw.
type sample struct {
	at   time.Time
	pods []podView
	// lockHolders is status.holderCount of each source's lock, by cluster.
	lockHolders map[string]int32
	// phase is the test's phase when the sample was taken (setPhase).
	phase string
}

// podSampler lists the Pods of its sources every samplePeriod, keeps every
// sample and checks each one as it is taken. It lists as the admin user,
// straight from the API server.
type podSampler struct {
	sources []podSource
	check   func(sample) []string

	mu         sync.Mutex
	phase      string
	samples    []sample
	violations []string
	// firstHeld is when each Pod was first seen holding (ungated, not
	// terminating); firstFinished when it was first seen finished: in a
	// sample or, sooner, in a watch event.
	firstHeld, firstFinished map[types.UID]time.Time
	errs                     int
	lastErr                  error
}

// samplePods starts sampling sources until the test ends; check (which may
// be nil) returns what is wrong with a sample. The test fails, at its end,
// on every violation found.
func samplePods(t *testing.T, check func(sample) []string, sources ...podSource) *podSampler {
	t.Helper()
	s := &podSampler{sources: sources, check: check, firstHeld: map[types.UID]time.Time{}, firstFinished: map[types.UID]time.Time{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(samplePeriod)
		defer tick.Stop()
		for {
			s.take(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	for _, src := range sources {
		if src.config != nil {
			s.watch(t, ctx, src)
		}
	}
	t.Cleanup(func() {
		cancel()
		<-done
		s.report(t)
	})
	return s
}

// watch records, from the watch events of src's Pods, when each starts
// holding and finishes. A watch that ends early leaves that to the samples.
func (s *podSampler) watch(t *testing.T, ctx context.Context, src podSource) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(src.config)
	if err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Pods(src.namespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			s.saw(viewPod(src.cluster, pod, time.Now()))
		}
	}()
}

// saw records when p was first seen holding and first seen finished.
func (s *podSampler) saw(p podView) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sawLocked(p)
}

func (s *podSampler) sawLocked(p podView) {
	if _, seen := s.firstHeld[p.uid]; !seen && p.holds(true) {
		s.firstHeld[p.uid] = p.at
	}
	if _, seen := s.firstFinished[p.uid]; !seen && p.finished {
		s.firstFinished[p.uid] = p.at
	}
}

// take lists every source once and records the sample.
func (s *podSampler) take(ctx context.Context) {
	sm := sample{at: time.Now(), lockHolders: map[string]int32{}}
	for _, src := range s.sources {
		var pods corev1.PodList
		if err := src.client.List(ctx, &pods, client.InNamespace(src.namespace)); err != nil {
			s.failed(ctx, err)
			return
		}
		for i := range pods.Items {
			sm.pods = append(sm.pods, viewPod(src.cluster, &pods.Items[i], sm.at))
		}
		if src.lock != "" {
			var dl locksv1alpha1.DistributedLock
			if err := src.client.Get(ctx, types.NamespacedName{Namespace: src.namespace, Name: src.lock}, &dl); err == nil {
				sm.lockHolders[src.cluster] = ptr.Deref(dl.Status.HolderCount, 0)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sm.phase = s.phase
	for _, p := range sm.pods {
		s.sawLocked(p)
	}
	s.samples = append(s.samples, sm)
	if s.check != nil {
		for _, v := range s.check(sm) {
			s.violations = append(s.violations, fmt.Sprintf("%s [%s]: %s", sm.at.Format("15:04:05.000"), sm.phase, v))
		}
	}
}

func (s *podSampler) failed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs++
	s.lastErr = err
}

// setPhase names the samples taken from now on.
func (s *podSampler) setPhase(phase string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phase = phase
}

// snapshot returns the samples taken so far.
func (s *podSampler) snapshot() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.samples)
}

// last returns the latest sample (zero before the first).
func (s *podSampler) last() sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) == 0 {
		return sample{}
	}
	return s.samples[len(s.samples)-1]
}

// heldSince returns when the Pod was first seen holding.
func (s *podSampler) heldSince(uid types.UID) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.firstHeld[uid]
	return at, ok
}

// finishedSince returns when the Pod was first seen finished (phase
// Succeeded or Failed).
func (s *podSampler) finishedSince(uid types.UID) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.firstFinished[uid]
	return at, ok
}

// count returns how many samples of phase (all, when empty) match.
func (s *podSampler) count(phase string, match func(sample) bool) (matched, of int) {
	for _, sm := range s.snapshot() {
		if phase != "" && sm.phase != phase {
			continue
		}
		of++
		if match(sm) {
			matched++
		}
	}
	return matched, of
}

// report fails the test on violations (the first 20 of them) and on a
// sampler that could not list.
func (s *podSampler) report(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Logf("pod sampler: %d samples every %v, %d violations, %d failed lists", len(s.samples), samplePeriod, len(s.violations), s.errs)
	for i, v := range s.violations {
		if i == 20 {
			t.Errorf("... and %d more violations", len(s.violations)-i)
			break
		}
		t.Errorf("sample violates: %s", v)
	}
	if s.errs > len(s.samples)/10 {
		t.Errorf("the sampler failed %d lists (last: %v)", s.errs, s.lastErr)
	}
}

// atMostHolders returns a check that a sample shows at most limit Pod
// holders, and a lock status showing at most limit holders.
func atMostHolders(limit int, terminatingReleases bool) func(sample) []string {
	return func(sm sample) []string {
		var out []string
		if n := holderCount(sm.pods, terminatingReleases); n > limit {
			out = append(out, fmt.Sprintf("%d Pods hold, at most %d may: %v", n, limit, describeHolders(sm.pods, terminatingReleases)))
		}
		for c, n := range sm.lockHolders {
			if int(n) > limit {
				out = append(out, fmt.Sprintf("the lock in cluster %s shows %d holders, at most %d may", c, n, limit))
			}
		}
		return out
	}
}

// describeHolders lists a sample's holders, sorted.
func describeHolders(pods []podView, terminatingReleases bool) []string {
	var out []string
	for _, ps := range holders(pods, terminatingReleases) {
		for _, p := range ps {
			out = append(out, p.String())
		}
	}
	sort.Strings(out)
	return out
}

// TestPodSamplerCatchesOverlap is the sampler's negative control: fed
// samples in which two Pods hold, its checks must report them, so that the
// Pod scenarios' "no overlap" cannot pass because the counting is blind.
func TestPodSamplerCatchesOverlap(t *testing.T) {
	running := func(c, name string, token int64) podView {
		return podView{cluster: c, name: name, uid: types.UID(c + "/" + name), phase: corev1.PodRunning, token: token}
	}
	gatedPod := func(c, name string) podView {
		p := running(c, name, 0)
		p.gated, p.phase = true, corev1.PodPending
		return p
	}
	now := time.Now()
	terminating := func(p podView, graceLeft time.Duration) podView {
		p.terminating, p.at, p.graceEnd = true, now, now.Add(graceLeft)
		return p
	}
	ended := func(p podView) podView { p.finished, p.phase = true, corev1.PodSucceeded; return p }

	tests := map[string]struct {
		pods                []podView
		lockHolders         map[string]int32
		terminatingReleases bool
		wantHolders         int
		wantClusters        int
		wantViolation       bool
	}{
		"one holder, two gated": {
			pods:        []podView{running("a", "p1", 7), gatedPod("a", "p2"), gatedPod("a", "p3")},
			wantHolders: 1, wantClusters: 1,
		},
		"two ungated Pods overlap": {
			pods:        []podView{running("a", "p1", 7), running("a", "p2", 8), gatedPod("a", "p3")},
			wantHolders: 2, wantClusters: 1, wantViolation: true,
		},
		"a terminating Pod holds until its grace period ends": {
			pods:        []podView{terminating(running("a", "p1", 7), time.Second), running("a", "p2", 8)},
			wantHolders: 2, wantClusters: 1, wantViolation: true,
		},
		"a terminating Pod past its grace period no longer runs": {
			pods:        []podView{terminating(running("a", "p1", 7), -time.Millisecond), running("a", "p2", 8)},
			wantHolders: 1, wantClusters: 1,
		},
		"with the handover Terminating a terminating Pod has released": {
			pods:                []podView{terminating(running("a", "p1", 7), time.Second), running("a", "p2", 8)},
			terminatingReleases: true,
			wantHolders:         1, wantClusters: 1,
		},
		"a finished Pod does not hold": {
			pods:        []podView{ended(running("a", "p1", 7)), running("a", "p2", 8)},
			wantHolders: 1, wantClusters: 1,
		},
		"one holder in each of two clusters": {
			pods:        []podView{running("a", "p1", 7), running("b", "p1", 8)},
			wantHolders: 2, wantClusters: 2, wantViolation: true,
		},
		"the lock's status shows two holders": {
			pods:        []podView{running("a", "p1", 7)},
			lockHolders: map[string]int32{"a": 2},
			wantHolders: 1, wantClusters: 1, wantViolation: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := holderCount(tc.pods, tc.terminatingReleases); got != tc.wantHolders {
				t.Errorf("holderCount = %d, want %d", got, tc.wantHolders)
			}
			if got := clustersHolding(tc.pods, tc.terminatingReleases); got != tc.wantClusters {
				t.Errorf("clustersHolding = %d, want %d", got, tc.wantClusters)
			}
			v := atMostHolders(1, tc.terminatingReleases)(sample{pods: tc.pods, lockHolders: tc.lockHolders})
			if got := len(v) > 0; got != tc.wantViolation {
				t.Errorf("atMostHolders(1) reported %q, want a violation: %v", v, tc.wantViolation)
			}
		})
	}
}
