package redis

import (
	"context"
	"errors"
	"sync"
	"time"
)

// maxBackground bounds the calls to nodes that a Locker's acquisitions leave
// running after they returned (see gather): past it, an acquisition waits
// for every node's answer before returning, as all of them did before.
const maxBackground = 64

// errClosed is the answer of a node called after Close.
var errClosed = errors.New("the locker is closed")

// background tracks the goroutines that outlive the call that started
// them: calls to nodes that had not answered when an acquisition's outcome
// was decided, with the cleanup of their answers, and the cleanup of nodes
// that failed. Close cancels them and waits for them.
type background struct {
	ctx    context.Context
	cancel context.CancelFunc
	slots  chan struct{}

	mu     sync.Mutex
	closed bool
	n      int
	wg     sync.WaitGroup
}

func newBackground() *background {
	ctx, cancel := context.WithCancel(context.Background())
	return &background{ctx: ctx, cancel: cancel, slots: make(chan struct{}, maxBackground)}
}

// spawn runs f in a tracked goroutine; it returns false, and does not run f,
// once the Locker is closed.
func (b *background) spawn(f func()) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.n++
	b.wg.Add(1)
	go func() {
		defer func() {
			b.mu.Lock()
			b.n--
			b.mu.Unlock()
			b.wg.Done()
		}()
		f()
	}()
	return true
}

// reserve takes n of the maxBackground slots, all or none, without waiting.
func (b *background) reserve(n int) bool {
	for i := range n {
		select {
		case b.slots <- struct{}{}:
		default:
			b.free(i)
			return false
		}
	}
	return true
}

// free returns n slots.
func (b *background) free(n int) {
	for range n {
		<-b.slots
	}
}

// callContext is the context of a call to a node that may outlive the
// caller: ctx's values without its cancellation, under timeout, and
// cancelled by Close.
func (b *background) callContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	stop := context.AfterFunc(b.ctx, cancel)
	return cctx, func() { stop(); cancel() }
}

// cleanupContext bounds one background cleanup call; Close cancels it.
func (b *background) cleanupContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(b.ctx, timeout)
}

// running is how many tracked goroutines have not ended.
func (b *background) running() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// stop refuses new goroutines and cancels the running ones' contexts.
func (b *background) stop() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cancel()
}

// wait waits for the tracked goroutines to end.
func (b *background) wait() { b.wg.Wait() }

// chains orders a Locker's calls for one owner to one node after that
// owner's late calls there: the calls of its acquisitions that returned
// before the node answered, and the cleanup of their answers (settleLate,
// settleFailed). The owner's next attempt (Acquire retries with one owner),
// the release of its lease or its dequeue must not run on the slow node
// before them and be undone by them (a late release after the next
// attempt's grant) or outlived by them (a late grant or join after the
// release or dequeue). Other owners' calls never wait: concurrent
// acquisitions run in parallel as before, and a node without late calls
// adds no wait.
type chains struct {
	mu   sync.Mutex
	late map[chainKey]map[*lateCall]struct{}
}

type chainKey struct {
	node  int
	owner string
}

// lateCall is a late call for an owner to one node.
type lateCall struct {
	c    *chains
	key  chainKey
	done chan struct{}
}

// before returns the owner's late calls to node i (its index in
// Locker.nodes): a call issued now waits for them (waitFor).
func (c *chains) before(i int, owner string) []chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []chan struct{}
	for lc := range c.late[chainKey{i, owner}] {
		out = append(out, lc.done)
	}
	return out
}

// waitFor waits for the calls of before, or for ctx to end.
func waitFor(ctx context.Context, prevs []chan struct{}) error {
	for _, p := range prevs {
		select {
		case <-p:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// add registers a late call for owner to node i; end ends it.
func (c *chains) add(i int, owner string) *lateCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.late == nil {
		c.late = map[chainKey]map[*lateCall]struct{}{}
	}
	lc := &lateCall{c: c, key: chainKey{i, owner}, done: make(chan struct{})}
	if c.late[lc.key] == nil {
		c.late[lc.key] = map[*lateCall]struct{}{}
	}
	c.late[lc.key][lc] = struct{}{}
	return lc
}

// end marks the late call over.
func (lc *lateCall) end() {
	lc.c.mu.Lock()
	defer lc.c.mu.Unlock()
	close(lc.done)
	delete(lc.c.late[lc.key], lc)
	if len(lc.c.late[lc.key]) == 0 {
		delete(lc.c.late, lc.key)
	}
}

// chainedFanOut is fanOut for calls for owner: on each node the call first
// waits, within its timeout, for the owner's late calls there (chains).
func chainedFanOut[T any](ctx context.Context, l *Locker, owner string, nodes []*node, timeout time.Duration, call func(context.Context, *node) (T, error)) []result[T] {
	prevs := make(map[*node][]chan struct{}, len(nodes))
	for _, n := range nodes {
		prevs[n] = l.chains.before(l.nodeIndex(n), owner)
	}
	return fanOut(ctx, nodes, timeout, func(ctx context.Context, n *node) (T, error) {
		if err := waitFor(ctx, prevs[n]); err != nil {
			var zero T
			return zero, errNotSent(err)
		}
		return call(ctx, n)
	})
}

func errNotSent(err error) error {
	return &notSentError{err}
}

// notSentError is a call that was never sent: a late call for the same
// owner to the node had not returned within its timeout.
type notSentError struct{ err error }

func (e *notSentError) Error() string {
	return "not sent: a late call for this owner to the node has not returned: " + e.err.Error()
}

func (e *notSentError) Unwrap() error { return e.err }

// nodeIndex is n's index in l.nodes.
func (l *Locker) nodeIndex(n *node) int {
	for i, m := range l.nodes {
		if m == n {
			return i
		}
	}
	return -1
}
