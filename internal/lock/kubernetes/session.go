package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// session is a Lease the holdings of this Locker's leases point at:
// renewing it renews them all.
type session struct {
	name    string
	ttl     time.Duration
	version string
	// valid is the end of the validity of the leases it carries (this
	// Locker's clock): the start of its last write plus ttl, less drift.
	valid time.Time
}

// errSessionGone says a session Lease was deleted: a contender found it
// expired, and its leases are lost.
var errSessionGone = errors.New("the session was deleted: a contender found it expired")

// sessionFor returns the Locker's session for ttl with at least half of
// ttl of validity left (so that a lease acquired in it is valid for at
// least that long), writing it when it has less, and creating a new one
// when it has none left or was deleted.
func (l *Locker) sessionFor(ctx context.Context, op string, ttl time.Duration) (*session, error) {
	l.smu.Lock()
	defer l.smu.Unlock()
	l.mu.Lock()
	s := l.current[ttl]
	var valid time.Time
	if s != nil {
		valid = s.valid
	}
	l.mu.Unlock()
	if s != nil {
		now := l.opts.Now()
		if valid.Sub(now) >= ttl/2 {
			return s, nil
		}
		if now.Before(valid) {
			err := l.renewSession(ctx, op, s)
			if err == nil {
				return s, nil
			}
			if !errors.Is(err, errSessionGone) {
				return nil, err
			}
		}
		l.abandon(s)
	}
	s = &session{name: newName(), ttl: ttl}
	start := l.opts.Now()
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	out, err := l.leases.Create(cctx, l.sessionObject(s, start), metav1.CreateOptions{})
	if err != nil {
		return nil, apiError(op+": create a session", err)
	}
	l.mu.Lock()
	s.version, s.valid = out.ResourceVersion, validUntil(start, ttl)
	l.sessions[s.name], l.current[ttl] = s, s
	l.mu.Unlock()
	l.opts.Log.V(1).Info("Created session", "session", s.name, "ttl", ttl.String())
	return s, nil
}

// abandon forgets the Locker's session s (its leases are lost) and deletes
// it, best effort, so that nobody can renew it again. Call with l.smu held.
func (l *Locker) abandon(s *session) {
	l.mu.Lock()
	delete(l.sessions, s.name)
	if l.current[s.ttl] == s {
		delete(l.current, s.ttl)
	}
	version := s.version
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), l.opts.opTimeout)
	defer cancel()
	err := l.leases.Delete(ctx, s.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &version}})
	if err != nil && !apierrors.IsNotFound(err) {
		l.opts.Log.V(2).Info("Deleting an expired session failed; contenders delete it", "session", s.name, "err", err.Error())
	}
}

// sessionObject is the Lease of session s as written at now.
func (l *Locker) sessionObject(s *session, now time.Time) *coordinationv1.Lease {
	id := l.cfg.Identity
	if id == "" {
		id = "lockwarden"
	}
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:            s.name,
			ResourceVersion: s.version,
			Labels:          map[string]string{LabelStore: l.store, LabelRole: roleSession, "app.kubernetes.io/managed-by": "lockwarden"},
			Annotations:     map[string]string{AnnotationTTL: strconv.FormatInt(s.ttl.Milliseconds(), 10)},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &id,
			LeaseDurationSeconds: ptr.To(int32(math.Ceil(s.ttl.Seconds()))),
			RenewTime:            ptr.To(metav1.NewMicroTime(now)),
		},
	}
}

// renewSession writes session s on the version it last wrote, extending
// its validity to the start of the call plus its TTL. errSessionGone: a
// contender deleted it. Call with l.smu held.
func (l *Locker) renewSession(ctx context.Context, op string, s *session) error {
	for try := 0; ; try++ {
		start := l.opts.Now()
		l.mu.Lock()
		obj := l.sessionObject(s, start)
		l.mu.Unlock()
		cctx, cancel := l.callCtx(ctx)
		out, err := l.leases.Update(cctx, obj, metav1.UpdateOptions{})
		cancel()
		switch {
		case err == nil:
			l.mu.Lock()
			s.version, s.valid = out.ResourceVersion, validUntil(start, s.ttl)
			l.mu.Unlock()
			return nil
		case apierrors.IsNotFound(err):
			return fmt.Errorf("%s: session %s: %w", op, s.name, errSessionGone)
		case apierrors.IsConflict(err) && try == 0:
			// Only this Locker (or one recovering its leases) writes the
			// session, and contenders only delete it: a conflict is an
			// earlier write whose reply was lost. Read the version again.
			cctx, cancel := l.callCtx(ctx)
			cur, gerr := l.leases.Get(cctx, s.name, metav1.GetOptions{})
			cancel()
			if apierrors.IsNotFound(gerr) {
				return fmt.Errorf("%s: session %s: %w", op, s.name, errSessionGone)
			}
			if gerr != nil {
				return apiError(op+": renew the session", gerr)
			}
			l.mu.Lock()
			s.version = cur.ResourceVersion
			l.mu.Unlock()
		default:
			return apiError(op+": renew the session", err)
		}
	}
}

// verdict is what a Locker makes of a session a holding points at.
type verdict int

const (
	// alive: the session may still be renewed; its holdings hold.
	alive verdict = iota
	// expired: not renewed for a whole TTL since this Locker first saw its
	// version; not yet deleted.
	expired
	// gone: deleted; its holdings hold nothing.
	gone
)

// judgment is a verdict with, for a live session, how long it has left at
// most (0: unknown).
type judgment struct {
	v      verdict
	within time.Duration
	// expires is when the holdings expire unless renewed, as far as this
	// Locker can tell (its clock).
	expires time.Time
}

// judge says whether session name is alive. The Locker's own sessions
// are judged by their validity; others are read from the API. With prune,
// an expired session is deleted (on the version this Locker saw unchanged
// for a whole TTL, or its own last version) so that it can never be
// renewed, and is then gone. cache keeps the judgments of one call.
func (l *Locker) judge(ctx context.Context, op, name string, prune bool, cache map[string]judgment) (judgment, error) {
	if j, ok := cache[name]; ok && (j.v != expired || !prune) {
		return j, nil
	}
	now := l.opts.Now()
	if s, valid, ok := l.ownSession(name); ok {
		if now.Before(valid) {
			cache[name] = judgment{v: alive, within: valid.Sub(now), expires: valid}
			return cache[name], nil
		}
		if !prune {
			cache[name] = judgment{v: expired}
			return cache[name], nil
		}
		l.smu.Lock()
		l.abandon(s)
		l.smu.Unlock()
	}
	cctx, cancel := l.callCtx(ctx)
	obj, err := l.leases.Get(cctx, name, metav1.GetOptions{})
	cancel()
	if apierrors.IsNotFound(err) {
		cache[name] = judgment{v: gone}
		return cache[name], nil
	}
	if err != nil {
		return judgment{}, apiError(op+": read session "+name, err)
	}
	ttl := sessionTTL(obj)
	l.mu.Lock()
	sg, ok := l.seen[name]
	if !ok || sg.version != obj.ResourceVersion {
		sg = sighting{version: obj.ResourceVersion, since: now}
		l.seen[name] = sg
	}
	l.mu.Unlock()
	if left := sg.since.Add(ttl - l.opts.earlyExpiry).Sub(now); left > 0 {
		cache[name] = judgment{v: alive, within: left, expires: sg.since.Add(ttl)}
		return cache[name], nil
	}
	if !prune {
		cache[name] = judgment{v: expired}
		return cache[name], nil
	}
	// Not renewed for a whole TTL of this clock: delete it on that very
	// version, so that a renewal racing with this either lands first (and
	// the delete fails) or fails.
	cctx, cancel = l.callCtx(ctx)
	err = l.leases.Delete(cctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &sg.version}})
	cancel()
	switch {
	case err == nil || apierrors.IsNotFound(err):
		l.mu.Lock()
		delete(l.seen, name)
		l.mu.Unlock()
		l.opts.Log.V(1).Info("Deleted an expired session", "session", name, "ttl", ttl.String())
		cache[name] = judgment{v: gone}
	case apierrors.IsConflict(err):
		// Renewed meanwhile.
		cache[name] = judgment{v: alive, within: ttl, expires: now.Add(ttl)}
	default:
		return judgment{}, apiError(op+": delete expired session "+name, err)
	}
	return cache[name], nil
}

// ownSession returns the Locker's session named name and its validity.
func (l *Locker) ownSession(name string) (*session, time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.sessions[name]; s != nil {
		return s, s.valid, true
	}
	return nil, time.Time{}, false
}

// sessionTTL is the TTL a session Lease was written with.
func sessionTTL(obj *coordinationv1.Lease) time.Duration {
	if ms, err := strconv.ParseInt(obj.Annotations[AnnotationTTL], 10, 64); err == nil && ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	if d := obj.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
		return time.Duration(*d) * time.Second
	}
	// A session that says nothing of its TTL: the longest a lease may wait.
	return time.Hour
}

// collectSessions deletes the store's sessions that nobody renews any more,
// at most once per collectEvery: a session of a process that crashed or was
// replaced stays in the namespace until a contender meets it on a key, and
// one whose leases were all released is met by nobody. Each is judged as a
// contender judges it (unchanged for a whole TTL since this Locker first saw
// it, then deleted on that version), so the first pass only records what it
// saw. Best effort: errors wait for the next pass.
func (l *Locker) collectSessions(ctx context.Context) {
	l.mu.Lock()
	now := l.opts.Now()
	if l.collecting || (!l.collected.IsZero() && now.Sub(l.collected) < l.opts.collectEvery) {
		l.mu.Unlock()
		return
	}
	l.collecting, l.collected = true, now
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.collecting = false
		l.mu.Unlock()
	}()
	const op = "collect expired sessions"
	opts := metav1.ListOptions{LabelSelector: l.selector(roleSession), Limit: 500}
	cache := map[string]judgment{}
	deleted := 0
	listed := map[string]bool{}
	for {
		cctx, cancel := l.callCtx(ctx)
		list, err := l.leases.List(cctx, opts)
		cancel()
		if err != nil {
			l.opts.Log.V(2).Info("Listing the sessions failed; trying at the next pass", "err", err.Error())
			return
		}
		for i := range list.Items {
			name := list.Items[i].Name
			listed[name] = true
			if _, _, own := l.ownSession(name); own {
				continue
			}
			j, err := l.judge(ctx, op, name, true, cache)
			if err == nil && j.v == gone {
				deleted++
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}
	// Forget the sessions that are gone, however they went.
	l.mu.Lock()
	for name := range l.seen {
		if !listed[name] {
			delete(l.seen, name)
		}
	}
	l.mu.Unlock()
	if deleted > 0 {
		l.opts.Log.V(1).Info("Deleted the sessions nobody renews", "count", deleted)
	}
}
