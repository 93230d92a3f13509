package zookeeper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// watchBuffer is how many release notifications a Watch channel buffers; when
// the reader falls further behind, notifications are dropped (a waiter polls too).
const watchBuffer = 64

// Watch delivers the names of released keys until ctx ends, then closes the
// channel (see lock.Locker). It keeps a ZooKeeper child watch on every key
// node (re-armed after each event, as ZooKeeper watches fire once) and
// delivers a key when a holder or slot node went away, when an acquisition and
// release happened between two looks, or when the head of a free key's queue
// changed (a waiter left, so the next one may go). With no keys it also
// watches the keys directory and every key node that appears in it. It
// returns once the watches are set, so a release after Watch returns is
// delivered (best effort: a waiter must also poll).
func (l *Locker) Watch(ctx context.Context, keys ...string) (<-chan string, error) {
	if len(keys) > 0 {
		if err := lock.ValidateKeyList("keys", keys); err != nil {
			return nil, err
		}
	}
	op := fmt.Sprintf("watch keys %q", keys)
	// The goroutine that closes the channel is tracked, so Close waits for
	// the watch loops to end.
	if !l.track() {
		return nil, l.unavailable(op, errLockerClosed)
	}
	if err := l.ready(ctx); err != nil {
		l.wg.Done()
		return nil, l.unavailable(op, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(l.ctx, cancel) // Close ends every watch
	w := &watcher{l: l, ctx: wctx, out: make(chan string, watchBuffer)}
	if len(keys) == 0 {
		if err := w.watchAll(); err != nil {
			cancel()
			stop()
			w.wg.Wait()
			l.wg.Done()
			return nil, l.unavailable(op, err)
		}
	} else {
		errs := parallel(len(keys), func(i int) error { return w.watchKey(keys[i], false) })
		if err := errors.Join(errs...); err != nil {
			cancel()
			stop()
			w.wg.Wait()
			l.wg.Done()
			return nil, l.unavailable(op, err)
		}
	}
	go func() {
		defer l.wg.Done()
		<-wctx.Done()
		stop()
		w.wg.Wait()
		close(w.out)
	}()
	return w.out, nil
}

type watcher struct {
	l   *Locker
	ctx context.Context
	out chan string
	wg  sync.WaitGroup

	mu      sync.Mutex
	watched map[string]bool // keys with a running watch loop
}

// keyState is what a watch loop last saw of a key.
type keyState struct {
	exists bool
	used   bool  // the key node was ever written: some acquisition happened
	held   int   // holder and slot nodes
	mutex  bool  // one of them is the holder node
	mzxid  int64 // key node mzxid: changes with every acquisition
	head   string
}

// look reads a key's children with a watch (or the key node's existence
// with a watch, while it does not exist).
func (w *watcher) look(key string) (keyState, <-chan zk.Event, error) {
	type res struct {
		st keyState
		ch <-chan zk.Event
	}
	p := w.l.keyPath(key)
	r, err := call(w.ctx, w.l, func(c *zk.Conn) (res, error) {
		children, stat, ch, err := c.ChildrenW(p)
		if errors.Is(err, zk.ErrNoNode) {
			var ok bool
			ok, _, ch, err = c.ExistsW(p)
			if err != nil || !ok {
				return res{ch: ch}, err
			}
			// Created in between: look again (a shadowing := here once
			// dropped this second answer and reported ErrNoNode).
			children, stat, ch, err = c.ChildrenW(p)
		}
		if err != nil {
			return res{}, err
		}
		st := keyState{exists: true, used: stat.Version > 0, mzxid: stat.Mzxid}
		var waiters []string
		for _, n := range children {
			if isLeaseNode(n) {
				st.held++
				st.mutex = st.mutex || n == holderName
			} else if _, _, ok := parseWaiter(n); ok {
				waiters = append(waiters, n)
			}
		}
		if len(waiters) > 0 {
			st.head = slices.Min(waiters)
		}
		return res{st, ch}, nil
	})
	return r.st, r.ch, err
}

// released tells whether the change from prev to cur is worth a wake-up: a
// holder or slot node went away, or, while a semaphore's slots are held,
// the head of the queue left (took a slot, or gave up).
func released(prev, cur keyState) bool {
	if cur.held < prev.held {
		return true // a holder or a slot went away
	}
	if cur.held > 0 {
		return !cur.mutex && prev.head != "" && cur.head != prev.head
	}
	return prev.held > 0 || // the holder went away
		(prev.exists && cur.mzxid != prev.mzxid) || // taken and released in between
		(!prev.exists && cur.exists && cur.used) || // created, used and released in between
		(prev.head != "" && cur.head != prev.head) // the head of the queue left
}

// watchKey sets the first watch on key and starts its loop. fresh says the
// key node appeared after Watch started (a watch on all keys), so a release
// already done on it is delivered.
func (w *watcher) watchKey(key string, fresh bool) error {
	w.mu.Lock()
	if w.watched == nil {
		w.watched = map[string]bool{}
	}
	if w.watched[key] {
		w.mu.Unlock()
		return nil
	}
	w.watched[key] = true
	w.mu.Unlock()
	st, ch, err := w.look(key)
	if err != nil {
		w.mu.Lock()
		delete(w.watched, key)
		w.mu.Unlock()
		return err
	}
	if fresh && st.used && st.held == 0 {
		w.deliver(key)
	}
	w.wg.Go(func() { w.loop(key, st, ch) })
	return nil
}

func (w *watcher) loop(key string, prev keyState, ch <-chan zk.Event) {
	b := w.l.opts.Backoff
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-ch:
		}
		for {
			cur, next, err := w.look(key)
			if err == nil {
				if released(prev, cur) {
					w.deliver(key)
				}
				prev, ch = cur, next
				b = w.l.opts.Backoff
				break
			}
			// ZooKeeper unreachable: look again later; the watch set after
			// the reconnection compares with what was seen before.
			select {
			case <-w.ctx.Done():
				return
			case <-time.After(b.Step()):
			}
		}
	}
}

func (w *watcher) deliver(key string) {
	select {
	case w.out <- key:
	default:
		w.l.log.V(2).Info("Dropped a release notification: the watcher is not reading", "key", key)
	}
}

// watchAll watches the keys directory for new key nodes, and every key node,
// and resyncs after every reconnection (see resync).
func (w *watcher) watchAll() error {
	reconnected, unsubscribe := w.l.subscribeReconnect()
	names, ch, err := w.listKeys()
	if err != nil {
		unsubscribe()
		return err
	}
	w.wg.Go(func() {
		defer unsubscribe()
		for {
			select {
			case <-w.ctx.Done():
				return
			case <-reconnected:
			}
			w.resync()
		}
	})
	errs := parallel(len(names), func(i int) error {
		if k, ok := decodeKey(names[i]); ok {
			return w.watchKey(k, false)
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	w.wg.Go(func() {
		b := w.l.opts.Backoff
		for {
			select {
			case <-w.ctx.Done():
				return
			case <-ch:
			}
			for {
				names, next, err := w.listKeys()
				if err == nil {
					for _, n := range names {
						if k, ok := decodeKey(n); ok {
							if err := w.watchKey(k, true); err != nil {
								w.l.log.V(2).Info("Watching a new key failed", "key", k, "err", err.Error())
							}
						}
					}
					ch = next
					b = w.l.opts.Backoff
					break
				}
				select {
				case <-w.ctx.Done():
					return
				case <-time.After(b.Step()):
				}
			}
		}
	})
	return nil
}

func (w *watcher) listKeys() ([]string, <-chan zk.Event, error) {
	type res struct {
		names []string
		ch    <-chan zk.Event
	}
	r, err := call(w.ctx, w.l, func(c *zk.Conn) (res, error) {
		names, _, ch, err := c.ChildrenW(w.l.keysPath)
		return res{names, ch}, err
	})
	return r.names, r.ch, err
}

// resync runs after the client established a session again after a
// disconnection (the same session, or a new one after an expiry): releases
// may have been missed meanwhile (watch events lost with the connection, the
// watch of a new key that failed to be set, notifications of a session that
// expired), so it lists the keys again, watches those not watched yet, and
// delivers every key that has waiters: each of them may be free for the
// next one now, and a spurious wake-up costs a waiter one attempt. It
// retries with backoff until it got through or the watch ends.
func (w *watcher) resync() {
	b := w.l.opts.Backoff
	for w.ctx.Err() == nil {
		err := w.resyncOnce()
		if err == nil {
			return
		}
		w.l.log.V(2).Info("Resync of the watch after a reconnection failed; retrying", "err", err.Error())
		select {
		case <-w.ctx.Done():
			return
		case <-time.After(b.Step()):
		}
	}
}

func (w *watcher) resyncOnce() error {
	names, err := call(w.ctx, w.l, func(c *zk.Conn) ([]string, error) {
		names, _, err := c.Children(w.l.keysPath)
		return names, err
	})
	if err != nil {
		return err
	}
	var keys []string
	for _, n := range names {
		if k, ok := decodeKey(n); ok {
			keys = append(keys, k)
		}
	}
	errs := parallel(len(keys), func(i int) error {
		if err := w.watchKey(keys[i], true); err != nil {
			return err
		}
		children, err := call(w.ctx, w.l, func(c *zk.Conn) ([]string, error) {
			ch, _, err := c.Children(w.l.keyPath(keys[i]))
			return ch, err
		})
		if errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, n := range children {
			if _, _, ok := parseWaiter(n); ok {
				w.deliver(keys[i])
				break
			}
		}
		return nil
	})
	return errors.Join(errs...)
}
