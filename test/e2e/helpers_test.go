//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/devcluster"
)

// kubectl runs the cached kubectl against the cluster as the admin user and
// returns its output; it fails the test when kubectl fails.
func kubectl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if err := kubectlCmd(t, stdin, &out, &out, args...).Run(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// kubectlErr runs kubectl as kubectl does and returns its stdout, its
// stderr and how it ended, for commands that are expected to fail.
func kubectlErr(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = kubectlCmd(t, "", &out, &errOut, args...).Run()
	return out.String(), errOut.String(), err
}

func kubectlCmd(t *testing.T, stdin string, stdout, stderr *bytes.Buffer, args ...string) *exec.Cmd {
	t.Helper()
	bin := filepath.Join(cluster.Assets, "kubectl")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kubectl is not in %s (hack/control-plane.sh --e2e builds it): %v", cluster.Assets, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.Kubeconfig)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	return cmd
}

// waitFor polls cond every 250 ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if err != nil {
			last = err
			return false, nil
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("waiting %v for %s: %v (last error: %v)", timeout, what, err, last)
	}
}

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(t *testing.T, name string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := cluster.Client.Create(t.Context(), ns); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.Delete(context.Background(), ns)
	})
	return name
}

// newLock returns a lock on key with inline endpoints: the cluster's Redis
// masters on 127.0.0.1, which the operator's --endpoint-allow allows.
func newLock(ns, name, key string, identity string) *locksv1alpha1.DistributedLock {
	dl := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys:       []string{key},
			TTLSeconds: 30,
			Contention: locksv1alpha1.ContentionQueue,
			Backend:    locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: cluster.RedisAddrs()}},
		},
	}
	if identity != "" {
		dl.Spec.Holder = &locksv1alpha1.ManualHolder{Identity: identity}
	}
	return dl
}

// newBackendLock returns a lock on key that uses the cluster's
// ClusterLockBackend dev-redis (its first Redis master).
func newBackendLock(ns, name, key string, identity string) *locksv1alpha1.DistributedLock {
	dl := newLock(ns, name, key, identity)
	dl.Spec.Backend = locksv1alpha1.Backend{ClusterBackendRef: &locksv1alpha1.ClusterBackendRef{Name: devcluster.DevRedisBackend}}
	return dl
}

func getLock(ctx context.Context, ns, name string) (*locksv1alpha1.DistributedLock, error) {
	var dl locksv1alpha1.DistributedLock
	err := cluster.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &dl)
	return &dl, err
}

func conditionStatus(dl *locksv1alpha1.DistributedLock, t string) metav1.ConditionStatus {
	c := meta.FindStatusCondition(dl.Status.Conditions, t)
	if c == nil {
		return ""
	}
	return c.Status
}

// The kwok annotations that make a Pod "run" for a while: kwok takes the
// delay from delay, capped at jitter-delay (default 5 s).
const (
	kwokCompleteDelay  = "pod-complete.stage.kwok.x-k8s.io/delay"
	kwokCompleteJitter = "pod-complete.stage.kwok.x-k8s.io/jitter-delay"
)

// kwokJob returns a Job with annotations whose one Pod (template labels
// podLabels) runs for runFor under kwok and then succeeds.
func kwokJob(ns, name string, annotations, podLabels map[string]string, runFor time.Duration) *batchv1.Job {
	d := runFor.String()
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: map[string]string{kwokCompleteDelay: d, kwokCompleteJitter: d}},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers:                    []corev1.Container{{Name: "work", Image: "busybox:1.37", Command: []string{"true"}}},
				},
			},
		},
	}
}

// newCronJob returns a CronJob that names lock on the CronJob object (as
// `kubectl annotate cronjob` does) and whose Pods run for runFor.
func newCronJob(ns, name, lock string, runFor time.Duration) *batchv1.CronJob {
	d := runFor.String()
	return &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{locksv1alpha1.AnnotationLock: lock}},
		Spec: batchv1.CronJobSpec{
			Schedule:                   "*/1 * * * *",
			SuccessfulJobsHistoryLimit: ptr.To[int32](20),
			FailedJobsHistoryLimit:     ptr.To[int32](5),
			JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{
				BackoffLimit: ptr.To[int32](0),
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{kwokCompleteDelay: d, kwokCompleteJitter: d}},
					Spec: corev1.PodSpec{
						RestartPolicy: corev1.RestartPolicyNever,
						Containers: []corev1.Container{{
							Name: "work", Image: "busybox:1.37",
							Command: []string{"sh", "-c", "echo $LOCKWARDEN_FENCING_TOKEN"},
						}},
					},
				},
			}},
		},
	}
}

// run is one Pod's stay in phase Running, as a watch on Pods saw it.
type run struct {
	pod, job string
	// schedule is the Job's CronJob schedule time.
	schedule string
	// token is the Pod's lockwarden.io/fencing-token annotation when it started running.
	token int64
	// jobToken is the Job's annotation at the same moment.
	jobToken int64
	// envFromAnnotation says whether every container gets
	// LOCKWARDEN_FENCING_TOKEN from the Pod's annotation.
	envFromAnnotation bool
	// start and end are the positions of the watch events that began and
	// ended the run (end 0: still running).
	start, end int
	// startedAt and endedAt are when the test saw it start and end.
	startedAt, endedAt time.Time
}

// podRecorder watches a namespace's Pods and records, in the API server's
// order of events, when each Pod runs. Two runs overlap when a Pod starts
// running while another one has not ended yet.
type podRecorder struct {
	mu sync.Mutex
	// limit is how many runs may overlap (a lock's maxHolders; 1: none);
	// most is the most that did.
	limit, most int
	seq         int
	runs        map[types.UID]*run
	order       []*run
	running     map[types.UID]*run
	overlaps    []string
	err         error
}

// recordPods starts recording the Pods of ns until the test ends.
func recordPods(t *testing.T, ns string) *podRecorder {
	t.Helper()
	return recordPodsLimit(t, ns, 1)
}

// recordPodsLimit records the Pods of ns, of which up to limit may run at once.
func recordPodsLimit(t *testing.T, ns string, limit int) *podRecorder {
	t.Helper()
	r := &podRecorder{limit: limit, runs: map[types.UID]*run{}, running: map[types.UID]*run{}}
	n := watchPods(t, ns, r.observe, func(err error) {
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
	})
	if n > 0 {
		t.Fatalf("namespace %s already has %d pods", ns, n)
	}
	return r
}

// watchPods calls observe with every event of a watch on the Pods of ns,
// from now until the test ends (watch errors go to onErr), and returns how
// many Pods ns had when it started.
func watchPods(t *testing.T, ns string, observe func(context.Context, watch.EventType, *corev1.Pod), onErr func(error)) int {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cs.CoreV1().Pods(ns).Watch(ctx, o)
		},
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range rw.ResultChan() {
			if ev.Type == watch.Error {
				onErr(fmt.Errorf("pod watch: %v", ev.Object))
				continue
			}
			if pod, ok := ev.Object.(*corev1.Pod); ok {
				observe(ctx, ev.Type, pod)
			}
		}
	}()
	t.Cleanup(func() {
		rw.Stop()
		cancel()
		<-done
	})
	return len(list.Items)
}

func (r *podRecorder) observe(ctx context.Context, typ watch.EventType, pod *corev1.Pod) {
	running := typ != watch.Deleted && pod.Status.Phase == corev1.PodRunning
	r.mu.Lock()
	r.seq++
	seq := r.seq
	cur, known := r.runs[pod.UID]
	wasRunning := r.running[pod.UID] != nil
	r.mu.Unlock()
	switch {
	case running && !known:
		ru := &run{pod: pod.Name, start: seq, startedAt: time.Now(), envFromAnnotation: envFromAnnotation(pod)}
		ru.token, _ = strconv.ParseInt(pod.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
		if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "Job" {
			ru.job = ref.Name
			var job batchv1.Job
			if err := cluster.Client.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: ref.Name}, &job); err == nil {
				ru.jobToken, _ = strconv.ParseInt(job.Annotations[locksv1alpha1.AnnotationFencingToken], 10, 64)
				ru.schedule = job.Annotations["batch.kubernetes.io/cronjob-scheduled-timestamp"]
			}
		}
		r.mu.Lock()
		if len(r.running) >= r.limit {
			for _, other := range r.running {
				r.overlaps = append(r.overlaps, fmt.Sprintf("%s (token %d) started running at event %d while %s (token %d, since event %d) was running, %d running in all",
					ru.pod, ru.token, seq, other.pod, other.token, other.start, len(r.running)+1))
			}
		}
		r.runs[pod.UID] = ru
		r.running[pod.UID] = ru
		r.most = max(r.most, len(r.running))
		r.order = append(r.order, ru)
		r.mu.Unlock()
	case !running && wasRunning:
		r.mu.Lock()
		cur.end, cur.endedAt = seq, time.Now()
		delete(r.running, pod.UID)
		r.mu.Unlock()
	}
}

// envFromAnnotation reports whether every container of pod gets
// LOCKWARDEN_FENCING_TOKEN from the Pod's fencing-token annotation.
func envFromAnnotation(pod *corev1.Pod) bool {
	want := "metadata.annotations['" + locksv1alpha1.AnnotationFencingToken + "']"
	for _, c := range pod.Spec.Containers {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == locksv1alpha1.EnvFencingToken })
		if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != want {
			return false
		}
	}
	return len(pod.Spec.Containers) > 0
}

// snapshot returns copies of the runs in the order they started.
func (r *podRecorder) snapshot() []run {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]run, len(r.order))
	for i, ru := range r.order {
		out[i] = *ru
	}
	return out
}

// maxConcurrent returns the most runs that overlapped.
func (r *podRecorder) maxConcurrent() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.most
}

// finished returns the runs that ended.
func (r *podRecorder) finished() []run {
	return slices.DeleteFunc(r.snapshot(), func(ru run) bool { return ru.end == 0 })
}

// check fails the test on overlapping runs, tokens that did not rise with
// every run, or Pods without their token.
func (r *podRecorder) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	overlaps, werr := slices.Clone(r.overlaps), r.err
	r.mu.Unlock()
	if werr != nil {
		t.Errorf("%v", werr)
	}
	for _, o := range overlaps {
		t.Errorf("overlapping runs: %s", o)
	}
	var prev int64
	runs := r.snapshot()
	for i, ru := range runs {
		t.Logf("run %d: pod %s (job %s, schedule %s) token %d, events %d..%d", i+1, ru.pod, ru.job, ru.schedule, ru.token, ru.start, ru.end)
		if r.limit == 1 && ru.token <= prev {
			t.Errorf("run %d (pod %s): fencing token %d does not rise above the previous run's %d", i+1, ru.pod, ru.token, prev)
		}
		// Holders of a semaphore's slots may start their Pods in another
		// order than they acquired, but a run that started after another
		// ended acquired after it: its token is larger.
		for _, before := range runs[:i] {
			if r.limit > 1 && before.end != 0 && before.end < ru.start && ru.token <= before.token {
				t.Errorf("run %d (pod %s) started after %s ended but has fencing token %d, not above its %d", i+1, ru.pod, before.pod, ru.token, before.token)
			}
			if r.limit > 1 && ru.token == before.token {
				t.Errorf("runs %s and %s share fencing token %d", before.pod, ru.pod, ru.token)
			}
		}
		if ru.token != ru.jobToken {
			t.Errorf("run %d (pod %s): the Pod's fencing-token annotation %d differs from its Job's %d", i+1, ru.pod, ru.token, ru.jobToken)
		}
		if !ru.envFromAnnotation {
			t.Errorf("run %d (pod %s): a container lacks %s from the Pod's annotation %s", i+1, ru.pod, locksv1alpha1.EnvFencingToken, locksv1alpha1.AnnotationFencingToken)
		}
		prev = ru.token
	}
}
