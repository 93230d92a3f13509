package redis

import (
	"context"
	"errors"
	"sync"
	"time"
)

// maxCleanups bounds the background cleanups of a Locker's acquisitions (see
// settle): past it, an acquisition does its own cleanup before returning.
const maxCleanups = 64

// errClosed is the answer of a node called after Close.
var errClosed = errors.New("the locker is closed")

// background tracks the goroutines an acquisition leaves running after it
// returned: calls to nodes that had not answered when the outcome was
// decided, and the cleanup of their late answers. Close cancels them and
// waits for them.
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
	return &background{ctx: ctx, cancel: cancel, slots: make(chan struct{}, maxCleanups)}
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

// spawnCleanup runs f in a tracked goroutine when one of the maxCleanups
// slots is free; otherwise (or once closed) it returns false and the caller
// runs f itself.
func (b *background) spawnCleanup(f func()) bool {
	select {
	case b.slots <- struct{}{}:
	default:
		return false
	}
	if !b.spawn(func() {
		defer func() { <-b.slots }()
		f()
	}) {
		<-b.slots
		return false
	}
	return true
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

// owners orders, per owner token, a Redlock acquisition's background cleanup
// against the same owner's later attempts (Acquire retries with one owner):
// a release or dequeue is sent only while no later attempt of the owner has
// started, and an attempt starts only once the cleanup calls already sent
// have ended. So a cleanup never undoes what a later attempt took.
type owners struct {
	mu sync.Mutex
	m  map[string]*ownerState
}

type ownerState struct {
	gen      uint64        // attempts started
	refs     int           // attempts not settled yet
	inflight int           // cleanup calls under way
	idle     chan struct{} // closed when inflight drops to 0
	// last holds, per node (index in Locker.nodes), a channel closed when
	// the owner's latest acquire call to that node has returned.
	last []chan struct{}
}

// begin registers a new attempt of owner, once the cleanup calls under way
// for it have ended (or ctx ends), and returns its number.
func (o *owners) begin(ctx context.Context, owner string) (uint64, error) {
	for {
		o.mu.Lock()
		if o.m == nil {
			o.m = map[string]*ownerState{}
		}
		st := o.m[owner]
		if st == nil {
			st = &ownerState{}
			o.m[owner] = st
		}
		if st.inflight == 0 {
			st.gen++
			st.refs++
			gen := st.gen
			o.mu.Unlock()
			return gen, nil
		}
		idle := st.idle
		o.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// chain registers the owner's next acquire call to node i (of n nodes): it
// returns a channel closed when the owner's previous call to that node has
// returned, which the call must wait for before it is sent, and the channel
// to close when this call returns. So one owner's scripts run on each node
// in the order its attempts were made, although an attempt returns before
// every node answered (a later script of the same owner would otherwise be
// undone or overwritten by an earlier one still on its way).
func (o *owners) chain(owner string, i, n int) (prev <-chan struct{}, done chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	st := o.m[owner]
	if st.last == nil {
		st.last = make([]chan struct{}, n)
	}
	prev, done = st.last[i], make(chan struct{})
	st.last[i] = done
	return prev, done
}

// lastCalls returns, per node, a channel closed when the owner's latest
// acquire call to it has returned (nil entries: none pending), or nil.
func (o *owners) lastCalls(owner string) []chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if st := o.m[owner]; st != nil && st.last != nil {
		return append([]chan struct{}(nil), st.last...)
	}
	return nil
}

// act runs f unless a later attempt of the owner has started.
func (o *owners) act(owner string, gen uint64, f func()) {
	o.mu.Lock()
	st := o.m[owner]
	if st == nil || st.gen != gen {
		o.mu.Unlock()
		return
	}
	if st.inflight == 0 {
		st.idle = make(chan struct{})
	}
	st.inflight++
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		st.inflight--
		if st.inflight == 0 {
			close(st.idle)
		}
		o.mu.Unlock()
	}()
	f()
}

// end marks an attempt of owner settled.
func (o *owners) end(owner string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	st := o.m[owner]
	if st == nil {
		return
	}
	st.refs--
	if st.refs <= 0 && st.inflight == 0 {
		delete(o.m, owner)
	}
}
