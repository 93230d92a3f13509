package memory

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Inspect reports what the store holds for each key (see lock.KeyState):
// its live holders, oldest first (at most lock.MaxInspectHolders) and their
// exact count, their fencing tokens and their times on the store's clock,
// the last token issued when the key is free, and the head of its queue (at
// most lock.MaxInspectWaiters live waiters, oldest first) with the exact
// number of live waiters. It changes nothing.
func (l *Locker) Inspect(ctx context.Context, keys []string) ([]lock.KeyState, error) {
	if err := lock.ValidateKeyList("keys", keys); err != nil {
		return nil, err
	}
	var out []lock.KeyState
	err := l.call(ctx, fmt.Sprintf("inspect keys %q", keys), func(now time.Time) {
		out = l.store.inspect(now, keys)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// InspectMany reports what Inspect would for each set of keys, in one call
// to the store (see lock.BatchInspector). An invalid set of keys fails alone.
func (l *Locker) InspectMany(ctx context.Context, keys [][]string) ([][]lock.KeyState, []error) {
	out := make([][]lock.KeyState, len(keys))
	errs := make([]error, len(keys))
	var valid []int
	for i, k := range keys {
		if err := lock.ValidateKeyList(fmt.Sprintf("keys[%d]", i), k); err != nil {
			errs[i] = err
			continue
		}
		valid = append(valid, i)
	}
	if len(valid) == 0 {
		return out, errs
	}
	err := l.call(ctx, fmt.Sprintf("inspect the keys of %d locks", len(valid)), func(now time.Time) {
		for _, i := range valid {
			out[i] = l.store.inspect(now, keys[i])
		}
	})
	if err != nil {
		for _, i := range valid {
			out[i], errs[i] = nil, err
		}
	}
	return out, errs
}

// inspect is Inspect under s.mu.
func (s *Store) inspect(now time.Time, keys []string) []lock.KeyState {
	out := make([]lock.KeyState, len(keys))
	for i, k := range keys {
		st := lock.KeyState{Key: k}
		if e := s.keys[k]; e != nil {
			st.Fence = e.fence
			for _, h := range e.holders {
				if !s.live(h, now) {
					continue
				}
				st.HolderCount++
				if len(st.Holders) < lock.MaxInspectHolders {
					st.Holders = append(st.Holders, lock.HolderState{Holder: h.holder, Fence: h.fence, Acquired: h.acquired, Expires: h.expires, Weight: h.weight})
				}
			}
			if len(st.Holders) > 0 {
				h := st.Holders[0]
				st.Held, st.Holder, st.Fence, st.Acquired, st.Expires = true, h.Holder, h.Fence, h.Acquired, h.Expires
			}
			for _, w := range e.queue {
				if !waiting(w, now) {
					continue
				}
				st.Queued++
				if len(st.Waiters) < lock.MaxInspectWaiters {
					st.Waiters = append(st.Waiters, lock.Waiter{Holder: w.holder, Since: w.since})
				}
			}
		}
		out[i] = st
	}
	return out
}

// Watch delivers the names of released keys (with no keys: of every key of
// the store) until ctx ends or the Locker is closed, then closes the channel
// (see lock.Locker). A key is delivered when a lease releases it (Release,
// or Renew of a lost lease releasing the rest), and when a waiter that may
// have been next leaves its queue (Dequeue), so that the next one tries at
// once; not when a lease expires. The channel buffers a few notifications
// and drops the ones its reader is not ready for: a slow reader never
// blocks a Release. It returns once the watch is active: a release after it
// returns is delivered.
func (l *Locker) Watch(ctx context.Context, keys ...string) (<-chan string, error) {
	if len(keys) > 0 {
		if err := lock.ValidateKeyList("keys", keys); err != nil {
			return nil, err
		}
	}
	w := &watcher{locker: l, ch: make(chan string, watchBuffer)}
	if len(keys) > 0 {
		w.keys = slices.Clone(keys)
	}
	s := l.store
	err := l.call(ctx, fmt.Sprintf("watch keys %q", keys), func(time.Time) {
		if !s.dropping { // a subscription whose reply is lost is not made
			s.watchers[w] = struct{}{}
		}
	})
	if err != nil {
		return nil, err
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-l.closed:
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.endWatch(w)
	}()
	return w.ch, nil
}
