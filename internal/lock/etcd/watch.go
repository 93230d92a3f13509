package etcd

import (
	"context"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Watch delivers the names of released keys until ctx ends or the Locker is
// closed (see lock.Locker); with no keys, of every key under the prefix. It
// is an etcd watch for DELETE events on the holder and slot keys (a release and a
// lease expiry both delete them) and on the waiter keys (a waiter that
// leaves the queue, by Dequeue or by its lease running out, may make the
// next one the head of a free key). A watch that fails (a member lost its
// leader, the connection broke) is re-established from the last revision it
// delivered. When that revision was compacted meanwhile, a release may have
// been missed: a watch of one key delivers the key once, and the watch of
// every key delivers each key that has waiters then (a free key nobody
// waits for needs no wake-up). Delivery is best effort: a waiter must also
// poll. Watch reads the current revision first (every release after Watch
// returns is delivered), so it fails with an error matching
// lock.ErrBackendUnavailable when etcd does not answer.
func (l *Locker) Watch(ctx context.Context, keys ...string) (<-chan string, error) {
	if len(keys) > 0 {
		if err := lock.ValidateKeys(keys); err != nil {
			return nil, err
		}
	}
	// The watches start at the revision current when Watch is called, so
	// a release right after Watch returns is delivered even when the
	// watches are registered on the server later.
	if err := l.connect(); err != nil {
		return nil, l.unavailable("watch", err)
	}
	rctx, rcancel := l.opCtx(ctx)
	resp, err := l.etcd().Get(rctx, l.prefix+"rev", clientv3.WithCountOnly())
	rcancel()
	if err != nil {
		return nil, l.unavailable("watch", err)
	}
	from := resp.Header.Revision + 1
	out := make(chan string, 64)
	wctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(l.ctx, cancel)
	var wg sync.WaitGroup
	if len(keys) == 0 {
		wg.Go(func() { l.watchLoop(wctx, l.holderPrefix(), "", from, out) })
		wg.Go(func() { l.watchLoop(wctx, l.slotRoot(), "", from, out) })
		wg.Go(func() { l.watchLoop(wctx, l.queueRoot(), "", from, out) })
	}
	for _, k := range keys {
		wg.Go(func() { l.watchLoop(wctx, l.holderKey(k), k, from, out) })
		wg.Go(func() { l.watchLoop(wctx, l.slotPrefix(k), k, from, out) })
		wg.Go(func() { l.watchLoop(wctx, l.queuePrefix(k), k, from, out) })
	}
	go func() {
		wg.Wait()
		stop()
		cancel()
		close(out)
	}()
	return out, nil
}

// watchLoop watches the holder or waiter keys of one lock key (key names
// it; hk is its holder key or its queue prefix) or, with key empty, every
// key under the prefix hk (holderPrefix or queueRoot), from revision from
// on, and sends the lock keys of the deleted ones to out.
func (l *Locker) watchLoop(ctx context.Context, hk, key string, from int64, out chan<- string) {
	send := func(k string) bool {
		select {
		case out <- k:
			return true
		case <-ctx.Done():
			return false
		}
	}
	prefix := key == "" || strings.HasSuffix(hk, "/")
	b := l.opts.Backoff
	rev := from
	for ctx.Err() == nil {
		opts := []clientv3.OpOption{clientv3.WithFilterPut()}
		if prefix {
			opts = append(opts, clientv3.WithPrefix())
		}
		opts = append(opts, clientv3.WithRev(rev))
		// WithRequireLeader: a member cut off from the leader ends the
		// watch instead of staying silent; it is re-established below.
		for resp := range l.etcd().Watch(clientv3.WithRequireLeader(ctx), hk, opts...) {
			if resp.CompactRevision != 0 {
				rev = resp.CompactRevision
				if !l.resync(ctx, hk, key, send) {
					return
				}
				continue
			}
			if err := resp.Err(); err != nil {
				l.log.V(2).Info("Watch failed; re-establishing it", "key", hk, "err", err.Error())
				continue
			}
			for _, ev := range resp.Events {
				rev = max(rev, ev.Kv.ModRevision+1)
				if !isDelete(ev) {
					continue
				}
				k := key
				if k == "" {
					var ok bool
					if k, ok = l.lockKeyOf(string(ev.Kv.Key)); !ok {
						l.log.V(2).Info("Ignoring a foreign key under the lock prefix", "key", string(ev.Kv.Key))
						continue
					}
				}
				if !send(k) {
					return
				}
			}
			b = l.opts.Backoff
		}
		t := time.NewTimer(b.Step())
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// resync is what a watch delivers when the revision it would resume from
// was compacted, so a release may have been missed: its one key, or, for
// the watch of every key, each key that has waiters now (read from etcd;
// when that read fails, none: the waiters' own polling covers them). It
// returns false when ctx ended.
func (l *Locker) resync(ctx context.Context, hk, key string, send func(string) bool) bool {
	if key != "" {
		// The holder and the queue watch of a key both resync: deliver once.
		return hk != l.holderKey(key) || send(key)
	}
	if hk != l.queueRoot() {
		return true
	}
	rctx, cancel := l.opCtx(ctx)
	resp, err := l.etcd().Get(rctx, hk, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	cancel()
	if err != nil {
		l.log.V(2).Info("Reading the queues after a compaction failed; waiters find out by polling", "err", err.Error())
		return true
	}
	seen := map[string]bool{}
	for _, kv := range resp.Kvs {
		k, ok := l.lockKeyOf(string(kv.Key))
		if !ok || seen[k] {
			continue
		}
		seen[k] = true
		if !send(k) {
			return false
		}
	}
	return true
}

// lockKeyOf returns the lock key whose holder key ("P h/E"), slot key
// ("P s/E/T") or waiter key ("P q/E/T") is k.
func (l *Locker) lockKeyOf(k string) (string, bool) {
	var e string
	if rest, ok := strings.CutPrefix(k, l.holderPrefix()); ok {
		e = rest
	} else if rest, ok := cutEither(k, l.queueRoot(), l.slotRoot()); ok {
		e, _, ok = strings.Cut(rest, "/")
		if !ok {
			return "", false
		}
	} else {
		return "", false
	}
	key, err := unescapeKey(e)
	return key, err == nil && key != ""
}

// cutEither is strings.CutPrefix with the first of two prefixes k has.
func cutEither(k, a, b string) (string, bool) {
	if rest, ok := strings.CutPrefix(k, a); ok {
		return rest, true
	}
	return strings.CutPrefix(k, b)
}
