package postgres

import (
	"context"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/util/wait"
)

// watchBuffer is how many release notifications a Watch channel buffers; when
// the reader falls further behind, notifications are dropped (a waiter polls too).
const watchBuffer = 64

// idleCheck is how long the listening connection waits for a notification
// before it checks with a round trip that the server is still there (a
// paused or partitioned server closes no connection).
const idleCheck = 10 * time.Second

// reconnectBackoff paces the listening connection's reconnects.
var reconnectBackoff = wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 1 << 30, Cap: 5 * time.Second}

// Watch delivers the names of released keys until ctx ends, then closes the
// channel (see lock.Locker); with no keys, releases of every key in the
// Locker's schema. Releases come from the Locker's one listening connection
// (LISTEN on "<schema>_released"), opened on the first Watch and reconnected
// with backoff. Watch returns once that connection listens, so a release
// committed after Watch returns is delivered while the connection stays up.
// When it had to reconnect, every watched key is delivered once (a release
// may have been missed meanwhile); a Watch of every key gets the keys that
// have queued waiters then (read from the waiters table once LISTEN is
// active again, oldest waiter first, at most watchBuffer of them), since a
// release of one of those may have been missed while nobody listened. A
// Dequeue that leaves a free key's queue to the next waiter is delivered
// too, so that waiter tries at once.
func (l *Locker) Watch(ctx context.Context, keys ...string) (<-chan string, error) {
	if len(keys) > 0 {
		if err := validateKeys("keys", keys); err != nil {
			return nil, err
		}
	}
	sub := &subscription{ch: make(chan string, watchBuffer), done: make(chan struct{})}
	if len(keys) > 0 {
		sub.keys = make(map[string]struct{}, len(keys))
		for _, k := range keys {
			sub.keys[k] = struct{}{}
		}
	}
	if err := l.lis.subscribe(ctx, sub, true); err != nil {
		return nil, err
	}
	l.unsubscribeWhenDone(ctx, sub)
	return sub.ch, nil
}

// watchForAcquire is Watch for a waiting Acquire: it does not wait for the
// listening connection. When that connection is not up yet (or is
// reconnecting), every key is delivered once as soon as it listens, so the
// waiter tries again then and misses no release notified before.
func (l *Locker) watchForAcquire(ctx context.Context, keys ...string) (<-chan string, error) {
	sub := &subscription{ch: make(chan string, watchBuffer), done: make(chan struct{}), keys: make(map[string]struct{}, len(keys))}
	for _, k := range keys {
		sub.keys[k] = struct{}{}
	}
	if err := l.lis.subscribe(ctx, sub, false); err != nil {
		return nil, err
	}
	l.unsubscribeWhenDone(ctx, sub)
	return sub.ch, nil
}

// unsubscribeWhenDone ends sub when ctx ends (or the Locker closes it).
func (l *Locker) unsubscribeWhenDone(ctx context.Context, sub *subscription) {
	go func() {
		select {
		case <-ctx.Done():
		case <-sub.done:
		}
		l.lis.unsubscribe(sub)
	}()
}

// subscription is one Watch.
type subscription struct {
	keys map[string]struct{} // nil: every key
	ch   chan string
	done chan struct{} // closed by unsubscribe, with ch
	// early: subscribed while the connection was not listening; its keys
	// are delivered once when it is (guarded by listener.mu).
	early bool
}

// listener is a Locker's listening connection and the Watch subscriptions it feeds.
type listener struct {
	l *Locker

	mu      sync.Mutex
	started bool
	closed  bool
	up      bool          // LISTEN is active on a live connection
	upCh    chan struct{} // closed when up becomes true; replaced when it goes down
	subs    map[*subscription]struct{}
	done    chan struct{} // closed when run returns
}

func newListener(l *Locker) *listener {
	return &listener{l: l, upCh: make(chan struct{}), subs: map[*subscription]struct{}{}, done: make(chan struct{})}
}

// subscribe registers sub and starts the connection if needed. With waitUp
// it waits until the connection listens (bounded by the operation timeout)
// and fails otherwise; without, it returns at once.
func (s *listener) subscribe(ctx context.Context, sub *subscription, waitUp bool) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return s.l.unavailable("watch", fmt.Errorf("the locker is closed"))
	}
	s.subs[sub] = struct{}{}
	if !s.started {
		s.started = true
		go s.run()
	}
	up, upCh := s.up, s.upCh
	sub.early = !up
	s.mu.Unlock()
	if up || !waitUp {
		return nil
	}
	if err := s.l.ensureSchema(ctx); err != nil {
		s.unsubscribe(sub)
		return err
	}
	t := time.NewTimer(s.l.opts.opTimeout)
	defer t.Stop()
	select {
	case <-upCh:
		return nil
	case <-ctx.Done():
		s.unsubscribe(sub)
		return s.l.unavailable("watch", ctx.Err())
	case <-t.C:
		s.unsubscribe(sub)
		return s.l.unavailable("watch", fmt.Errorf("the listening connection did not come up within %v", s.l.opts.opTimeout))
	}
}

// unsubscribe removes sub and closes its channel; calling it again is a no-op.
func (s *listener) unsubscribe(sub *subscription) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.subs[sub]; !ok {
		return
	}
	delete(s.subs, sub)
	close(sub.ch)
	close(sub.done)
}

// dispatch delivers key to the subscriptions that watch it, never blocking.
func (s *listener) dispatch(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		if sub.keys != nil {
			if _, ok := sub.keys[key]; !ok {
				continue
			}
		}
		select {
		case sub.ch <- key:
		default:
			s.l.log.V(2).Info("Dropped a release notification: the watcher is not reading", "key", key)
		}
	}
}

// wake delivers every watched key once to the subscriptions that may have
// missed releases: all of them after a reconnect (releases notified while
// the connection was down are lost), else those subscribed before the
// connection first listened. A subscription to every key gets waited, the
// keys that had waiters when the connection listened again, after a
// reconnect.
func (s *listener) wake(reconnected bool, waited []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		early := sub.early
		sub.early = false
		if !early && !reconnected {
			continue
		}
		keys := slices.Collect(maps.Keys(sub.keys))
		if sub.keys == nil && reconnected {
			keys = waited
		}
		for _, k := range keys {
			select {
			case sub.ch <- k:
			default:
			}
		}
	}
}

func (s *listener) setUp(up bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if up == s.up {
		return
	}
	s.up = up
	if up {
		close(s.upCh)
	} else {
		s.upCh = make(chan struct{})
	}
}

// close stops the connection and ends every Watch.
func (s *listener) close() {
	s.mu.Lock()
	s.closed = true
	started := s.started
	subs := make([]*subscription, 0, len(s.subs))
	for sub := range s.subs {
		subs = append(subs, sub)
	}
	s.mu.Unlock()
	if started {
		<-s.done // the Locker's context is cancelled: run returns
	}
	for _, sub := range subs {
		s.unsubscribe(sub)
	}
}

// run keeps a listening connection up until the Locker is closed.
func (s *listener) run() {
	defer close(s.done)
	ctx := s.l.ctx
	b := reconnectBackoff
	connectedBefore := false
	for ctx.Err() == nil {
		err := s.listen(ctx, connectedBefore, func(waited []string) {
			s.setUp(true)
			b = reconnectBackoff
			s.wake(connectedBefore, waited)
			connectedBefore = true
		})
		s.setUp(false)
		if ctx.Err() != nil {
			return
		}
		s.l.log.V(2).Info("Listening connection lost; reconnecting", "err", err.Error())
		t := time.NewTimer(b.Step())
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// listen opens one connection, LISTENs, calls onUp, and delivers
// notifications until the connection fails or ctx ends. On a reconnect with
// a subscription to every key, it reads the keys that have waiters once
// LISTEN is active (a release after that is notified) and hands them to onUp.
func (s *listener) listen(ctx context.Context, reconnected bool, onUp func(waited []string)) error {
	if err := s.l.ensureSchema(ctx); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, s.l.opts.opTimeout)
	conn, err := pgx.ConnectConfig(cctx, s.l.connCfg)
	if err != nil {
		cancel()
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(cctx, "LISTEN "+pgx.Identifier{s.l.channel}.Sanitize())
	var waited []string
	if err == nil && reconnected && s.watchesAll() {
		waited, err = s.waitedKeys(cctx, conn)
	}
	cancel()
	if err != nil {
		return err
	}
	onUp(waited)
	for {
		wctx, wcancel := context.WithTimeout(ctx, idleCheck)
		n, err := conn.WaitForNotification(wctx)
		wcancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			if conn.IsClosed() || wctx.Err() == nil {
				return err
			}
			// Idle: a paused server would never say so; ask it.
			pctx, pcancel := context.WithTimeout(ctx, s.l.opts.opTimeout)
			err = conn.Ping(pctx)
			pcancel()
			if err != nil {
				return err
			}
			continue
		}
		key, err := decodePayload(n.Payload)
		if err != nil {
			s.l.log.V(2).Info("Ignored a notification with an unexpected payload", "payload", n.Payload, "err", err.Error())
			continue
		}
		s.dispatch(key)
	}
}

// watchesAll reports whether a subscription watches every key.
func (s *listener) watchesAll() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		if sub.keys == nil {
			return true
		}
	}
	return false
}

// waitedKeys returns the keys that have live waiters, those waiting longest
// first, at most watchBuffer of them (what a Watch channel buffers).
func (s *listener) waitedKeys(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, "SELECT w.key FROM "+pgx.Identifier{s.l.schema, "waiters"}.Sanitize()+
		" w WHERE w.deadline >= clock_timestamp() GROUP BY w.key ORDER BY min(w.ticket) LIMIT $1", watchBuffer)
	if err != nil {
		return nil, fmt.Errorf("read the waited keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var k []byte
		err := r.Scan(&k)
		return string(k), err
	})
	if err != nil {
		return nil, fmt.Errorf("read the waited keys: %w", err)
	}
	return keys, nil
}

// decodePayload returns the key a release notification names (hex-encoded
// by the SQL functions: NOTIFY payloads are text, keys any bytes).
func decodePayload(p string) (string, error) {
	b, err := hex.DecodeString(p)
	if err != nil {
		return "", err
	}
	if len(b) == 0 || len(b) > MaxKeyBytes {
		return "", fmt.Errorf("key of %d bytes", len(b))
	}
	return string(b), nil
}
