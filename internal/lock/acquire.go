package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Wake is what a failed attempt tells BlockingAcquire to wait for, besides
// the next backoff step.
type Wake[E any] struct {
	// C delivers when what blocked the attempt may be gone: a release
	// message, a watch event. Nil: poll only. Each attempt gives it anew
	// (the same channel while the store keeps its watch); once closed it is
	// not waited on again until an attempt gives it again.
	C <-chan E
	// Now says that what blocked the attempt is gone already: the next
	// attempt comes at once (at most maxImmediate times in a row, so that a
	// state the store keeps misreading cannot spin).
	Now bool
	// Within is when the blocking lease ends by its TTL (0: unknown): the
	// next attempt comes shortly after it, whatever the backoff says.
	Within time.Duration
}

// Steps is what a store gives BlockingAcquire for one request.
type Steps[E any] struct {
	// Attempt makes one try of the request, as TryAcquire does.
	Attempt func(ctx context.Context) (*Lease, Wake[E], error)
	// Woken, if set, is told what C delivered (ok false: C was closed).
	Woken func(e E, ok bool)
	// Dequeue leaves the keys' queues when a queued request gives up.
	Dequeue func(ctx context.Context) error
	// Closed ends the wait when the Locker is closed; ClosedErr says so.
	Closed    <-chan struct{}
	ClosedErr error
}

// maxImmediate bounds the attempts in a row that Wake.Now starts at once.
const maxImmediate = 3

// BlockingAcquire is Locker.Acquire over a store's one attempt: it tries
// until it holds the lease or ctx ends, waiting between attempts for the
// store's wake-up (Wake.C), the blocking lease's end (Wake.Within) or the
// next backoff step, whichever comes first, and with req.Queue at most a
// third of the waiter TTL (so that its place in the queues stays live). A
// wake-up resets the backoff. With req.Queue it leaves the queues when ctx
// ends. When ctx ends the error wraps both ctx.Err() and the last whole
// attempt's error. A request dropped by a newer one (ErrReplaced) ends at
// once with that error.
func BlockingAcquire[E any](ctx context.Context, o *Options, req Request, s Steps[E]) (*Lease, error) {
	log := o.Log.WithValues("keys", req.Keys, "holder", req.Holder)
	var (
		lastErr   error
		wake      <-chan E
		closedC   <-chan E // the last C seen closed
		immediate int
	)
	b := o.backoffSteps()
	for ctx.Err() == nil {
		lease, w, err := s.Attempt(ctx)
		if err == nil {
			return lease, nil
		}
		if errors.Is(err, ErrReplaced) {
			// A newer request took the place (Request.Replace): waiting on
			// would queue this one again behind it.
			return nil, err
		}
		if ctx.Err() != nil {
			// Cut short by ctx: the attempt before says more about the keys.
			// Without one, what the cut attempt wrote may have landed (a
			// queued place, which Dequeue below takes back) but no lease
			// was granted: the keys were not acquired.
			if lastErr == nil {
				lastErr = fmt.Errorf("%w: the attempt was cut short: %w", ErrNotAcquired, err)
			}
			break
		}
		lastErr = err
		if s.Closed != nil {
			select {
			case <-s.Closed:
				return nil, fmt.Errorf("acquire keys %q: %w; last attempt: %w", req.Keys, s.ClosedErr, lastErr)
			default:
			}
		}
		if w.Now && immediate < maxImmediate {
			immediate++
			b = o.backoffSteps()
			continue
		}
		immediate = 0
		if wake = w.C; wake == closedC {
			wake = nil
		}
		var heartbeat time.Duration
		if req.Queue {
			heartbeat = o.WaiterTTL / 3
		}
		d := AcquireDelay(o.Backoff, b.Step(), w.Within, heartbeat)
		if v := log.V(4); v.Enabled() {
			v.Info("Waiting for lease", "wait", d.String(), "err", err.Error())
		}
		timer, stop := o.NewTimer(d)
		select {
		case <-ctx.Done():
		case <-s.Closed:
			stop()
			return nil, fmt.Errorf("acquire keys %q: %w; last attempt: %w", req.Keys, s.ClosedErr, lastErr)
		case e, ok := <-wake:
			if !ok {
				closedC = wake
			}
			if s.Woken != nil {
				s.Woken(e, ok)
			}
			b = o.backoffSteps()
		case <-timer:
		}
		stop()
	}
	if req.Queue && s.Dequeue != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.CleanupTimeout)
		if err := s.Dequeue(cctx); err != nil {
			log.V(2).Info("Leaving the queue failed; the place expires with the waiter TTL", "err", err.Error())
		}
		cancel()
	}
	if lastErr == nil {
		return nil, fmt.Errorf("acquire keys %q: %w", req.Keys, ctx.Err())
	}
	return nil, fmt.Errorf("acquire keys %q: %w; last attempt: %w", req.Keys, ctx.Err(), lastErr)
}

// AcquireDelay is how long BlockingAcquire waits before its next attempt when
// no wake-up comes: step, the next step of backoff b computed without
// jitter; the blocking holder's remaining TTL (0: unknown) when that comes
// first; at most heartbeat (0: no bound), a waiter's heartbeat. Jitter of
// b.Jitter (wait.Jitter) is added in every case but the heartbeat: under
// the cap (the jittered delay stays within b.Cap) and after the holder's TTL,
// so that the waiters of a crashed holder, which all see the same TTL, do
// not all try again in the same millisecond.
func AcquireDelay(b wait.Backoff, step, within, heartbeat time.Duration) time.Duration {
	j := b.Jitter
	if j <= 0 {
		j = defaultJitter
	}
	d := step
	if b.Cap > 0 && float64(d)*(1+j) > float64(b.Cap) {
		d = time.Duration(float64(b.Cap) / (1 + j))
	}
	d = wait.Jitter(d, j)
	if within > 0 {
		// Spread the wake-ups over up to j times the first backoff step
		// after the holder's TTL (the TTL itself can be long).
		if h := within + time.Millisecond + wait.Jitter(b.Duration, j) - b.Duration; h < d {
			d = h
		}
	}
	if heartbeat > 0 && d > heartbeat {
		d = heartbeat
	}
	return d
}

// defaultJitter is AcquireDelay's jitter when the backoff has none.
const defaultJitter = 0.1

// AcquireOnReleases is BlockingAcquire for a store whose wake-up is its
// release messages (Locker.Watch): attempt is its one try, returning the
// busy holder's remaining TTL when it knows it (0 when not); watch starts
// watching the releases of keys until its ctx ends; dequeue leaves the
// queues. A free key needs no watch: the first attempt is made before it.
// When the keys are busy it starts watching their releases and tries again
// at once, so that a release sent before the watch was active is seen by
// that attempt; a watch that cannot start leaves polling.
func AcquireOnReleases(ctx context.Context, o *Options, req Request,
	attempt func(context.Context) (*Lease, time.Duration, error),
	watch func(context.Context, ...string) (<-chan string, error),
	dequeue func(ctx context.Context, keys []string, owner string) error,
) (*Lease, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var released <-chan string
	watching := false
	return BlockingAcquire(ctx, o, req, Steps[string]{
		Attempt: func(ctx context.Context) (*Lease, Wake[string], error) {
			lease, within, err := attempt(ctx)
			if err == nil || watching || ctx.Err() != nil {
				return lease, Wake[string]{C: released, Within: within}, err
			}
			watching = true
			var werr error
			if released, werr = watch(wctx, req.Keys...); werr != nil {
				o.Log.V(2).Info("Watching releases failed; polling only", "keys", req.Keys, "err", werr.Error())
				released = nil
			}
			return nil, Wake[string]{C: released, Now: true}, err
		},
		Dequeue: func(ctx context.Context) error { return dequeue(ctx, req.Keys, req.Owner) },
	})
}

// Acquisitions gives a store's Locker its TryAcquire and Acquire (embed it)
// from the store's one attempt and its blocking wait: both get the request
// prepared (PrepareRequest, then Check), so a store writes only what is its
// own. H is what the store's attempt tells its wait (a hint, a watch), which
// TryAcquire drops.
type Acquisitions[H any] struct {
	// Check, if set, checks a prepared request against the store's own
	// limits (key length, scopes).
	Check func(req Request) error
	// Attempt makes one try of a prepared request (see Locker.TryAcquire).
	Attempt func(ctx context.Context, req Request) (*Lease, H, error)
	// Wait tries until it holds a prepared request or ctx ends (see
	// Locker.Acquire), usually with BlockingAcquire or AcquireOnReleases.
	Wait func(ctx context.Context, req Request) (*Lease, error)
	// Weights tells that the store takes weighted requests
	// (Request.Weight above 1); without it they are refused.
	Weights bool
}

func (a Acquisitions[H]) prepare(req Request, try bool) (Request, error) {
	req, err := PrepareRequest(req, try)
	if err != nil {
		return req, err
	}
	if req.Weight > 1 && !a.Weights {
		return req, &InvalidRequestError{Field: "weight", Reason: fmt.Sprintf("%d slots asked of a store that does not take weighted requests: ask for 1", req.Weight)}
	}
	if a.Check != nil {
		err = a.Check(req)
	}
	return req, err
}

// weighed sets the weight of a lease just granted for req.
func weighed(lease *Lease, req Request) *Lease {
	if lease != nil {
		lease.Weight = req.Slots()
	}
	return lease
}

// TryAcquire makes one attempt to take every key of req (see Locker).
func (a Acquisitions[H]) TryAcquire(ctx context.Context, req Request) (*Lease, error) {
	req, err := a.prepare(req, true)
	if err != nil {
		return nil, err
	}
	lease, _, err := a.Attempt(ctx, req)
	return weighed(lease, req), err
}

// Acquire blocks until it holds every key of req or ctx ends (see Locker).
func (a Acquisitions[H]) Acquire(ctx context.Context, req Request) (*Lease, error) {
	req, err := a.prepare(req, false)
	if err != nil {
		return nil, err
	}
	lease, err := a.Wait(ctx, req)
	return weighed(lease, req), err
}
