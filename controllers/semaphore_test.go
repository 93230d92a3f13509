package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/metrics"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// TestSemaphoreRunsThreeJobsAtATimeInFIFOOrder: fourteen Jobs on a lock with
// maxHolders 3. Never more than three run; the first three run at once, the
// others wait with their place in line on the Job (lockwarden.io/queue-position)
// and in the Waiting Event; each completion starts the oldest waiter, woken
// by the release notification (well before the fallback requeue), with a
// fencing token larger than every token before; the lock's status shows the
// slots, the holders and the exact queue length at each step, and so does
// lockwarden_queue_depth (11 at first: more than the 10 waiters status lists).
func TestSemaphoreRunsThreeJobsAtATimeInFIFOOrder(t *testing.T) {
	const slots, jobs = 3, 14
	rdb := redistest.Start(t)
	startManager(t, managerOptions{})
	ns := newNamespace(t, nil)
	c := env.Client
	dl := makeLock("exports", ns, rdb.Addr).obj()
	dl.Spec.MaxHolders = slots
	create(t, dl)
	cw := watchConcurrency(t, watchClient(t, env), ns, slots)

	names := make([]string, jobs)
	for i := range names {
		names[i] = fmt.Sprintf("export-%d", i)
		create(t, makeJob(names[i], ns).annotate(locksv1alpha1.AnnotationLock, "exports").obj())
		// One at a time, so that the queue's order is the creation order.
		eventually(t, 20*time.Second, "Job "+names[i]+" to run or wait in line", func() (bool, string) {
			j := getJob(t, c, ns, names[i])
			return running(j) || j.Annotations[locksv1alpha1.AnnotationQueuePosition] != "", fmt.Sprintf("%v", j.Annotations)
		})
	}

	var prev int64
	tokens := map[string]int64{}
	for done := 0; done <= jobs-slots; done++ {
		runningNow := names[done : done+slots]
		waiting := names[done+slots:]
		for _, n := range runningNow {
			j := waitRunning(t, c, waitingRequeue-time.Second, ns, n)
			if _, seen := tokens[n]; !seen {
				f := fence(t, j)
				if f <= prev {
					t.Fatalf("Job %s has fencing token %d, not larger than the previous holder's %d", n, f, prev)
				}
				tokens[n], prev = f, f
			}
		}
		for i, n := range waiting {
			want := fmt.Sprintf("%d/%d", i+1, len(waiting))
			eventually(t, 10*time.Second, "Job "+n+" to show position "+want, func() (bool, string) {
				j := getJob(t, c, ns, n)
				if running(j) {
					t.Fatalf("Job %s runs while %d older Jobs hold all %d slots", n, slots, slots)
				}
				return j.Annotations[locksv1alpha1.AnnotationQueuePosition] == want,
					fmt.Sprintf("%s=%q, %s=%q", locksv1alpha1.AnnotationQueuePosition, j.Annotations[locksv1alpha1.AnnotationQueuePosition],
						locksv1alpha1.AnnotationWaitingFor, j.Annotations[locksv1alpha1.AnnotationWaitingFor])
			})
		}
		eventually(t, 10*time.Second, "the lock's status to show 3 slots taken and the queue", func() (bool, string) {
			st := getLock(t, ns, "exports").Status
			var holders []string
			for _, h := range st.Holders {
				holders = append(holders, h.Name)
			}
			slices.Sort(holders)
			want := slices.Clone(runningNow)
			slices.Sort(want)
			return st.Slots == "3/3" && ptr.Deref(st.HolderCount, -1) == slots && ptr.Deref(st.QueueLength, -1) == int32(len(waiting)) && slices.Equal(holders, want),
				fmt.Sprintf("slots %q, holderCount %v, queueLength %v, holders %v (want %v)", st.Slots, ptr.Deref(st.HolderCount, -1), ptr.Deref(st.QueueLength, -1), holders, want)
		})
		// The metrics are set right after the status write.
		eventually(t, 10*time.Second, "lockwarden_queue_depth and lockwarden_lock_holders", func() (bool, string) {
			depth := testutil.ToFloat64(metrics.QueueDepth.WithLabelValues(ns, "exports"))
			holders := testutil.ToFloat64(metrics.LockHolders.WithLabelValues(ns, "exports"))
			return depth == float64(len(waiting)) && holders == slots, fmt.Sprintf("depth %v (want %d), holders %v", depth, len(waiting), holders)
		})
		if done == 0 {
			// The Waiting Event says where the last Job stands.
			eventually(t, 10*time.Second, "a Waiting event with the position", func() (bool, string) {
				evs := eventsFor(t, ns, names[jobs-1])
				for _, e := range evs {
					if strings.HasPrefix(e, locksv1alpha1.EventWaiting+":") && strings.Contains(e, fmt.Sprintf("position %d of %d", jobs-slots, jobs-slots)) {
						return true, ""
					}
				}
				return false, strings.Join(evs, " | ")
			})
		}
		if done < jobs-slots {
			complete(t, c, getJob(t, c, ns, names[done]))
		}
	}
	cw.check(t)
	if cw.maxSeen() != slots {
		t.Fatalf("at most %d Jobs ran at once, want %d: the semaphore did not fill its slots", cw.maxSeen(), slots)
	}
}

// concurrencyWatch watches a namespace's Jobs and records the most that ran at once.
type concurrencyWatch struct {
	mu    sync.Mutex
	limit int
	most  int
	over  []string
}

func watchConcurrency(t *testing.T, c client.WithWatch, namespace string, limit int) *concurrencyWatch {
	t.Helper()
	w, err := c.Watch(context.Background(), &batchv1.JobList{}, client.InNamespace(namespace))
	if err != nil {
		t.Fatal(err)
	}
	cw := &concurrencyWatch{limit: limit}
	go func() {
		runningNow := map[string]bool{}
		for ev := range w.ResultChan() {
			j, ok := ev.Object.(*batchv1.Job)
			if !ok {
				continue
			}
			runningNow[j.Name] = ev.Type != watch.Deleted && running(j)
			var names []string
			for n, r := range runningNow {
				if r {
					names = append(names, n)
				}
			}
			cw.mu.Lock()
			cw.most = max(cw.most, len(names))
			if len(names) > limit {
				slices.Sort(names)
				cw.over = append(cw.over, strings.Join(names, "+"))
			}
			cw.mu.Unlock()
		}
	}()
	t.Cleanup(w.Stop)
	return cw
}

func (cw *concurrencyWatch) check(t *testing.T) {
	t.Helper()
	cw.mu.Lock()
	defer cw.mu.Unlock()
	if len(cw.over) > 0 {
		t.Fatalf("more than %d Jobs ran at once: %v", cw.limit, cw.over)
	}
}

func (cw *concurrencyWatch) maxSeen() int {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return cw.most
}
