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
// is an etcd watch for DELETE events on the holder keys: a release and a
// lease expiry both delete them. A watch that fails (a member lost its
// leader, the connection broke, the revision was compacted) is
// re-established from the last revision it delivered; after a compaction the
// watched keys are delivered once, since a release may have been missed.
// Delivery is best effort: a waiter must also poll. Watch reads the current
// revision first (every release after Watch returns is delivered), so it
// fails with an error matching lock.ErrBackendUnavailable when etcd does not
// answer.
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
	}
	for _, k := range keys {
		wg.Go(func() { l.watchLoop(wctx, l.holderKey(k), k, from, out) })
	}
	go func() {
		wg.Wait()
		stop()
		cancel()
		close(out)
	}()
	return out, nil
}

// watchLoop watches one holder key (key names it) or, with key empty, every
// holder key under prefix hk, from revision from on, and sends the released
// keys to out.
func (l *Locker) watchLoop(ctx context.Context, hk, key string, from int64, out chan<- string) {
	send := func(k string) bool {
		select {
		case out <- k:
			return true
		case <-ctx.Done():
			return false
		}
	}
	b := l.opts.backoff
	rev := from
	for ctx.Err() == nil {
		opts := []clientv3.OpOption{clientv3.WithFilterPut()}
		if key == "" {
			opts = append(opts, clientv3.WithPrefix())
		}
		opts = append(opts, clientv3.WithRev(rev))
		// WithRequireLeader: a member cut off from the leader ends the
		// watch instead of staying silent; it is re-established below.
		for resp := range l.etcd().Watch(clientv3.WithRequireLeader(ctx), hk, opts...) {
			if resp.CompactRevision != 0 {
				rev = resp.CompactRevision
				if key != "" && !send(key) {
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
					var err error
					k, err = unescapeKey(strings.TrimPrefix(string(ev.Kv.Key), l.holderPrefix()))
					if err != nil {
						l.log.V(2).Info("Ignoring a foreign key under the holder prefix", "key", string(ev.Kv.Key))
						continue
					}
				}
				if !send(k) {
					return
				}
			}
			b = l.opts.backoff
		}
		t := time.NewTimer(b.Step())
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}
