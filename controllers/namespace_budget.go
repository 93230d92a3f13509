package controllers

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lockwarden/lockwarden/internal/metrics"
)

// Every reconcile of a lock or a gated Job may write to the API server (a
// few writes at most: finalizer, annotations, status) through the one API
// client every tenant shares (--kube-api-qps). A namespace whose locks or
// Jobs change faster than its share (--namespace-reconcile-qps reconciles a
// second in each of the two controllers, with a burst of ten seconds'
// worth) has its reconciles put back: each one over the share is given the
// next free turn of its namespace and comes back then, in the order they
// asked. Its Jobs start, queue and show their status later; the other
// namespaces' do not wait for it. Reconciles that must not wait are not
// counted: those of a Job or lock whose lease the operator holds (a lost
// lease stops its Job at once, a finished holder hands over at once) and
// those of objects being deleted or in a namespace being deleted.
//
// At the default, one namespace's Jobs use at most about a quarter to a
// half of the default client budget (200 requests a second, at one or two
// writes a reconcile), whatever it does with them; its locks likewise.
const (
	DefaultNamespaceQPS = 50
	namespaceBurstSecs  = 10
	// turnKept is how long a turn given to an object is kept for it after
	// it was due (its reconcile comes back at the turn).
	turnKept = time.Minute
	// overShareLogEvery is how often, at most, the operator's log says that
	// a namespace is over its share.
	overShareLogEvery = time.Minute
)

// namespaceBudget is the per-namespace share of one controller, with the
// turns it gave to the objects it put back.
type namespaceBudget struct {
	limiter *keyedLimiter
	mu      sync.Mutex
	turns   map[types.NamespacedName]time.Time
	// swept is when turns was last cleared of the turns long past.
	swept time.Time
	// logged is when each namespace was last said to be over its share.
	logged map[string]time.Time
}

// newNamespaceBudget is a share of qps reconciles a second per namespace
// (0: DefaultNamespaceQPS; negative: no bound, nil).
func newNamespaceBudget(qps float64) *namespaceBudget {
	switch {
	case qps < 0:
		return nil
	case qps == 0:
		qps = DefaultNamespaceQPS
	}
	return newBudget(qps, max(1, int(qps*namespaceBurstSecs)))
}

func newBudget(qps float64, burst int) *namespaceBudget {
	return &namespaceBudget{limiter: newKeyedLimiter(qps, burst), turns: map[types.NamespacedName]time.Time{}, logged: map[string]time.Time{}}
}

// admit says how long the reconcile of nn waits for its namespace's turn
// (0: it goes on now). The first time it must wait it is given the next
// free turn; until then it waits for that one, not for a new one.
func (b *namespaceBudget) admit(nn types.NamespacedName, now time.Time) time.Duration {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if turn, ok := b.turns[nn]; ok {
		if now.Before(turn) {
			return turn.Sub(now)
		}
		delete(b.turns, nn)
		return 0
	}
	wait := b.limiter.reserve(nn.Namespace, now)
	if wait > 0 {
		b.turns[nn] = now.Add(wait)
	}
	if now.Sub(b.swept) > turnKept {
		b.swept = now
		for other, turn := range b.turns {
			if now.Sub(turn) > turnKept {
				delete(b.turns, other) // its reconcile never came back: gone
			}
		}
	}
	return wait
}

// shouldLog says whether to log that namespace is over its share now (at
// most every overShareLogEvery).
func (b *namespaceBudget) shouldLog(namespace string, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if last, ok := b.logged[namespace]; ok && now.Sub(last) < overShareLogEvery {
		return false
	}
	for ns, last := range b.logged {
		if now.Sub(last) >= overShareLogEvery {
			delete(b.logged, ns)
		}
	}
	b.logged[namespace] = now
	return true
}

// forget drops the turn given to nn (it is gone).
func (b *namespaceBudget) forget(nn types.NamespacedName) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.turns, nn)
}

// withinBudget says whether the reconcile of nn may go on now; when it may
// not, res puts it back for its namespace's turn.
func withinBudget(ctx context.Context, budget *namespaceBudget, controller string, nn types.NamespacedName, now time.Time) (res ctrl.Result, ok bool) {
	wait := budget.admit(nn, now)
	if wait == 0 {
		return res, true
	}
	metrics.ReconcilesDeferred.WithLabelValues(controller).Inc()
	log := logf.FromContext(ctx)
	if budget.shouldLog(nn.Namespace, now) {
		// The reconcile's logger names the namespace.
		log.Info("The namespace is over its share of reconciles (--namespace-reconcile-qps): its locks and Jobs wait their turn; said at most once a minute per namespace",
			"retryAfter", wait)
	}
	log.V(1).Info("The namespace used its share of reconciles; put back until its turn", "retryAfter", wait)
	return ctrl.Result{RequeueAfter: wait}, false
}
