package controllers

import (
	"context"
	"encoding/binary"
	"hash/fnv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/metrics"
)

// resyncBackends bounds how many backends one resync inspects at once: a
// slow backend does not hold up the others, and many do not take every
// connection at once.
const resyncBackends = 4

// resyncEntry is what the resync knows of one lock: the backend its last
// reconcile read, its keys there, and a digest of the backend state its
// status was computed from.
type resyncEntry struct {
	locker lock.Locker
	keys   []string
	digest uint64
}

// resyncTable lists the locks whose status the resync keeps current: those
// whose last reconcile read their backend. A lock whose backend could not be
// used is brought back by its own requeue or by the backend's recovery.
type resyncTable struct {
	mu    sync.Mutex
	locks map[types.NamespacedName]resyncEntry
}

func newResyncTable() *resyncTable {
	return &resyncTable{locks: map[types.NamespacedName]resyncEntry{}}
}

// set records what the status of nn now shows.
func (t *resyncTable) set(nn types.NamespacedName, e resyncEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.locks[nn] = e
}

// drop forgets nn.
func (t *resyncTable) drop(nn types.NamespacedName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.locks, nn)
}

// resyncGroup is the locks of one backend, inspected together.
type resyncGroup struct {
	nns     []types.NamespacedName
	keys    [][]string
	digests []uint64
}

// byBackend groups the table's locks by the backend client they were read through.
func (t *resyncTable) byBackend() map[lock.Locker]*resyncGroup {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[lock.Locker]*resyncGroup{}
	for nn, e := range t.locks {
		g := out[e.locker]
		if g == nil {
			g = &resyncGroup{}
			out[e.locker] = g
		}
		g.nns = append(g.nns, nn)
		g.keys = append(g.keys, e.keys)
		g.digests = append(g.digests, e.digest)
	}
	return out
}

// stateDigest sums up what a lock's status shows of its backend's state:
// each key's holders and fencing tokens, the head of its queue and the
// counts. Expiries are left out: renewals move them and status does not
// show them for the operator's own leases.
func stateDigest(states []lock.KeyState) uint64 {
	h := fnv.New64a()
	var b [8]byte
	num := func(n int64) {
		binary.LittleEndian.PutUint64(b[:], uint64(n)) //nolint:gosec // G115: the bits are hashed, not read as a number
		_, _ = h.Write(b[:])
	}
	str := func(s string) {
		num(int64(len(s)))
		_, _ = h.Write([]byte(s))
	}
	for _, s := range states {
		str(s.Key)
		num(int64(holderCount(s)))
		num(int64(queueLength(s)))
		hs := holdersOf(s)
		num(int64(len(hs)))
		for _, x := range hs {
			str(x.Holder)
			num(x.Fence)
			num(x.Acquired.UnixMicro())
		}
		num(int64(len(s.Waiters)))
		for _, w := range s.Waiters {
			str(w.Holder)
			num(w.Since.UnixMicro())
		}
	}
	return h.Sum64()
}

// statusResync keeps every lock's status current with changes made outside
// this operator (a holder in another cluster, a key deleted by hand) without
// a reconcile per lock: every period it inspects the keys of all the locks
// of a backend in one batch (one pipelined round trip per Redis node, one query on the other stores) and
// asks for a reconcile of the locks whose backend state differs from what
// their status was computed from. It runs on the leader, where the locks are
// reconciled.
type statusResync struct {
	table    *resyncTable
	enqueue  func(context.Context, types.NamespacedName)
	interval time.Duration
	log      logr.Logger
	failures failureCounts
}

// NeedLeaderElection makes the resync run where the reconciles run: on the leader.
func (s *statusResync) NeedLeaderElection() bool { return true }

// Start resyncs every interval until ctx ends.
func (s *statusResync) Start(ctx context.Context) error {
	// The first period starts after one interval: at start every lock is
	// reconciled anyway.
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.resync(ctx)
		}
	}
}

// resync inspects every backend's locks once and enqueues those that changed.
func (s *statusResync) resync(ctx context.Context) {
	groups := s.table.byBackend()
	ctx, cancel := context.WithTimeout(ctx, s.interval)
	defer cancel()
	sem := make(chan struct{}, resyncBackends)
	var wg sync.WaitGroup
	for locker, g := range groups {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s.resyncBackend(ctx, locker, g)
		})
	}
	wg.Wait()
}

// resyncBackend inspects the locks of one backend and enqueues those whose
// state changed. Locks the backend did not answer for are not enqueued at
// once: an outage reaches them through the backend's health check
// (OnHealth), and a slow answer is tried again at the next period rather
// than turned into a reconcile of every lock. Only a lock the backend did
// not answer for in resyncFailures periods in a row is enqueued (its
// backend client may be one its reconcile no longer uses).
func (s *statusResync) resyncBackend(ctx context.Context, locker lock.Locker, g *resyncGroup) {
	states, errs := lock.InspectMany(ctx, locker, g.keys)
	metrics.StatusResyncBatches.Inc()
	metrics.StatusResyncLocks.Add(float64(len(g.nns)))
	changed, failed := 0, 0
	var firstErr error
	for i, nn := range g.nns {
		if errs[i] != nil {
			failed++
			if firstErr == nil {
				firstErr = errs[i]
			}
			if s.failures.failed(nn) < resyncFailures {
				continue
			}
		} else {
			s.failures.answered(nn)
			if stateDigest(states[i]) == g.digests[i] {
				continue
			}
		}
		changed++
		s.enqueue(ctx, nn)
	}
	if failed > 0 {
		s.log.Info("The backend did not answer the status resync for some locks; they are tried again at the next resync",
			"locks", failed, "of", len(g.nns), "error", firstErr.Error())
	}
	metrics.StatusResyncChanged.Add(float64(changed))
}

// resyncFailures is how many resyncs in a row the backend must fail to
// answer for a lock before the lock is reconciled.
const resyncFailures = 2

// failureCounts counts, per lock, the resyncs in a row its backend did not answer.
type failureCounts struct {
	mu sync.Mutex
	n  map[types.NamespacedName]int
}

// failed counts one more failure of nn and returns how many in a row;
// at resyncFailures the count starts again.
func (f *failureCounts) failed(nn types.NamespacedName) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[types.NamespacedName]int{}
	}
	f.n[nn]++
	n := f.n[nn]
	if n >= resyncFailures {
		delete(f.n, nn)
	}
	return n
}

// answered forgets the failures of nn.
func (f *failureCounts) answered(nn types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.n, nn)
}
