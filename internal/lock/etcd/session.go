package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/util/wait"
)

// session is an etcd lease that every holder key this Locker writes with one
// TTL (in whole seconds) is attached to, as the concurrency package's
// Session: one KeepAliveOnce renews every lease on it.
type session struct {
	id  clientv3.LeaseID
	ttl int64 // seconds
	// refreshed is the start (this Locker's clock) of the last grant or
	// keepalive etcd confirmed: its keys are held at least until
	// refreshed + ttl on the leader's clock, less the drift allowance.
	refreshed time.Time
}

// expires is the Expires of a lease of ttl on s.
func (s *session) expires(ttl time.Duration) time.Time {
	return s.refreshed.Add(ttl - drift(ttl))
}

// sessionFor returns the Locker's session for ttl, confirmed by etcd no
// earlier than fresh: it is kept alive (one KeepAliveOnce) when its last
// confirmation is older, and a new one is granted when there is none or
// etcd no longer has it (it expired: its keys are gone, and the leases on it
// are lost). It returns a copy: the Locker's own is changed by later calls.
func (l *Locker) sessionFor(ctx context.Context, ttl time.Duration, fresh time.Time) (*session, error) {
	secs := ttlSeconds(ttl)
	l.smu.Lock()
	defer l.smu.Unlock()
	if s := l.sessions[secs]; s != nil {
		if !s.refreshed.Before(fresh) {
			return new(*s), nil
		}
		start := l.opts.Now()
		kctx, cancel := l.opCtx(ctx)
		_, err := l.keepAliveOnce(kctx, s.id)
		cancel()
		switch {
		case err == nil:
			s.refreshed = start
			return new(*s), nil
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			l.log.Info("An etcd session expired; the leases on it are lost", "lease", int64(s.id), "ttlSeconds", secs)
			delete(l.sessions, secs)
		default:
			return nil, fmt.Errorf("keep the session alive: %w", err)
		}
	}
	start := l.opts.Now()
	gctx, cancel := l.opCtx(ctx)
	g, err := l.etcd().Grant(gctx, secs)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("grant a session: %w", err)
	}
	s := &session{id: g.ID, ttl: secs, refreshed: start}
	if l.sessions == nil {
		l.sessions = map[int64]*session{}
	}
	l.sessions[secs] = s
	l.log.V(1).Info("Granted an etcd session", "lease", int64(g.ID), "ttlSeconds", secs)
	return new(*s), nil
}

// forget drops the session id (etcd answered that it no longer exists), so
// that the next call grants a new one.
func (l *Locker) forget(id clientv3.LeaseID) {
	l.smu.Lock()
	defer l.smu.Unlock()
	for secs, s := range l.sessions {
		if s.id == id {
			delete(l.sessions, secs)
		}
	}
}

// cleanUpLater runs txn (a compare-and-delete that cannot touch anything
// but what it names) in the background until etcd answers or the Locker is
// closed. Keys on a session stay as long as the session is renewed, that is
// as long as this Locker lives: what an acquisition whose answer was lost
// wrote, or a lease whose release failed, would otherwise stay held.
func (l *Locker) cleanUpLater(what string, txn func(ctx context.Context) error) {
	l.bg.Go(func() {
		b := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Cap: 5 * time.Second, Steps: 1 << 30}
		for {
			ctx, cancel := context.WithTimeout(l.ctx, l.opts.opTimeout)
			err := txn(ctx)
			cancel()
			if err == nil || l.ctx.Err() != nil {
				return
			}
			l.log.V(2).Info("Cleaning up failed; trying again", "what", what, "err", err.Error())
			t := time.NewTimer(b.Step())
			select {
			case <-l.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	})
}

// undoLater deletes, in the background, the etcd keys (holder or slot keys)
// whose value is value: what an acquisition wrote whose answer was lost, or
// that could not be used. value is unique to that acquisition (it carries a
// random attempt number), so a later acquisition, of the same owner
// included, is never touched.
func (l *Locker) undoLater(keys []string, value string) {
	ops := make([]clientv3.Op, 0, len(keys))
	for _, k := range keys {
		ops = append(ops, clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value(k), "=", value)},
			[]clientv3.Op{clientv3.OpDelete(k)}, nil))
	}
	l.cleanUpLater(fmt.Sprintf("undo an acquisition (%d keys)", len(keys)), func(ctx context.Context) error {
		_, err := l.etcd().Txn(ctx).Then(ops...).Commit()
		return err
	})
}
