package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// watchBuffer is how many release notifications a Watch channel buffers; when
// the reader falls further behind, notifications are dropped (a waiter polls too).
const watchBuffer = 64

// Watch delivers the names of released keys until ctx ends, then closes the
// channel (see lock.Locker). With keys it subscribes to their release
// channels; with none, to every key's release channel under the prefix (a
// pattern subscription). It returns once the subscription is active on at
// least one node, so a release after Watch returns is delivered. In Redlock
// mode it subscribes on every node (nodes that are down are subscribed when
// they come back) and delivers one release once, even though every node
// publishes it. A release published when a waiter leaves the head of a queue
// is delivered too, so the next waiter tries at once.
func (l *Locker) Watch(ctx context.Context, keys ...string) (<-chan string, error) {
	if len(keys) > 0 {
		if err := l.validateKeys("keys", keys); err != nil {
			return nil, err
		}
	}
	var channels []string
	for _, k := range keys {
		channels = append(channels, l.channel(k))
	}
	var patterns []string
	if len(keys) == 0 {
		patterns = l.allChannelsPatterns()
	}
	confirm := func(ctx context.Context, ps *goredis.PubSub, want int) error {
		for range want {
			msg, err := ps.ReceiveTimeout(ctx, l.opts.nodeTimeout)
			if err != nil {
				return fmt.Errorf("subscribe to releases: %w", err)
			}
			if _, ok := msg.(*goredis.Subscription); !ok {
				return fmt.Errorf("subscribe to releases: unexpected message %T before the confirmation", msg)
			}
		}
		return nil
	}
	res := fanOut(ctx, l.nodes, l.opts.nodeTimeout, func(ctx context.Context, n *node) (*goredis.PubSub, error) {
		if len(patterns) == 0 {
			ps := n.client.Subscribe(ctx, channels...)
			return ps, confirm(ctx, ps, len(channels))
		}
		ps := n.client.PSubscribe(ctx, patterns...)
		err := confirm(ctx, ps, len(patterns))
		if err != nil && len(l.cfg.Scopes) > 0 && strings.Contains(err.Error(), "NOPERM") {
			// Redis compares a PSUBSCRIBE pattern with the user's channel
			// rules literally: a user set up for the whole prefix
			// (&P{*}:released, as docs/backends.md gave it before scopes)
			// may not subscribe to a scope's pattern, but to the prefix's.
			// The releases outside the scopes are dropped below.
			_ = ps.Close()
			ps = n.client.PSubscribe(ctx, l.prefixChannelsPattern())
			err = confirm(ctx, ps, 1)
		}
		return ps, err
	})
	active := 0
	var errs []error
	subs := make([]*goredis.PubSub, 0, len(res))
	for _, r := range res {
		subs = append(subs, r.val)
		if r.err != nil {
			errs = append(errs, r.nodeErr())
			l.log.V(2).Info("Subscribing to releases failed on node; go-redis retries in the background", "node", r.node.name, "err", r.err.Error())
			continue
		}
		active++
	}
	if active == 0 {
		for _, ps := range subs {
			_ = ps.Close()
		}
		return nil, l.failure(fmt.Sprintf("watch keys %q", keys), 0, errs)
	}

	out := make(chan string, watchBuffer)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		dedup = newRecent(256)
	)
	for _, ps := range subs {
		wg.Go(func() {
			for msg := range ps.Channel(goredis.WithChannelSize(watchBuffer)) {
				key, _, _ := strings.Cut(msg.Payload, " ")
				if key == "" || msg.Channel != l.channel(key) {
					// Whoever may publish on one key's channel does not
					// wake the waiters of another key.
					continue
				}
				if _, in := l.scopeOf(key); !in && len(l.cfg.Scopes) > 0 {
					continue
				}
				if len(subs) > 1 {
					mu.Lock()
					dup := dedup.seen(msg.Payload)
					mu.Unlock()
					if dup {
						continue
					}
				}
				select {
				case out <- key:
				default:
					l.log.V(2).Info("Dropped a release notification: the watcher is not reading", "key", key)
				}
			}
		})
	}
	go func() {
		<-ctx.Done()
		for _, ps := range subs {
			_ = ps.Close()
		}
		wg.Wait()
		close(out)
	}()
	return out, nil
}

// recent remembers the last n release payloads ("<key> <fence>"), so that a
// release published by several Redlock nodes is delivered once.
type recent struct {
	set  map[string]struct{}
	ring []string
	next int
}

func newRecent(n int) *recent {
	return &recent{set: make(map[string]struct{}, n), ring: make([]string, n)}
}

// seen records p and reports whether it was already recorded.
func (r *recent) seen(p string) bool {
	if _, ok := r.set[p]; ok {
		return true
	}
	if old := r.ring[r.next]; old != "" {
		delete(r.set, old)
	}
	r.ring[r.next] = p
	r.next = (r.next + 1) % len(r.ring)
	r.set[p] = struct{}{}
	return false
}
