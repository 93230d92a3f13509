package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Renew extends the lease to ttl from now (see lock.Locker): it checks that
// the acquisition still holds every key and renews its session, the one
// write that renews every lease of the session. A lease renewed with
// another TTL than its session's moves to this Locker's session of that
// TTL (one write per key). A lease of another Locker's session (an
// operator that restarted) takes that session over while it has not
// expired.
func (l *Locker) Renew(ctx context.Context, lease *lock.Lease, ttl time.Duration) (*lock.Lease, error) {
	out, errs := l.RenewAll(ctx, []*lock.Lease{lease}, ttl)
	if errs[0] != nil {
		var ie *lock.InvalidRequestError
		if errors.As(errs[0], &ie) {
			return nil, ie
		}
		return nil, errs[0]
	}
	return out[0], nil
}

// listAbove is how many keys RenewAll reads with one paged list of the
// store's Leases rather than one read each.
const listAbove = 32

// RenewAll renews many leases (see lock.Locker): it reads their keys (one
// list when they are many) and writes each session once.
func (l *Locker) RenewAll(ctx context.Context, leases []*lock.Lease, ttl time.Duration) ([]*lock.Lease, []error) {
	out := make([]*lock.Lease, len(leases))
	errs := make([]error, len(leases))
	if l.checkOpen("renew") == nil {
		l.collectSessions(ctx)
	}
	var valid []int
	var keys []string
	for i, le := range leases {
		err := lock.ValidateLease(le)
		if err == nil {
			err = lock.ValidateTTL(ttl)
		}
		if err == nil {
			err = l.checkScopes("lease.keys", le.Keys)
		}
		if err != nil {
			errs[i] = fmt.Errorf("leases[%d]: %w", i, err)
			continue
		}
		valid = append(valid, i)
		keys = append(keys, le.Keys...)
	}
	if len(valid) == 0 {
		return out, errs
	}
	op := fmt.Sprintf("renew %d leases", len(valid))
	fail := func(err error) ([]*lock.Lease, []error) {
		for _, i := range valid {
			errs[i] = err
		}
		return out, errs
	}
	if err := l.checkOpen(op); err != nil {
		return fail(err)
	}
	slices.Sort(keys)
	states, err := l.readKeys(ctx, op, slices.Compact(keys))
	if err != nil {
		return fail(err)
	}
	// The session each lease's holdings point at.
	sess := make([]string, len(leases))
	for _, i := range valid {
		le := leases[i]
		name, missing, preempted := holdingSession(states, le)
		if missing != "" {
			errs[i] = l.lost(ctx, le, fmt.Sprintf("key %q is no longer held by this acquisition (it expired, or another acquisition took it)", missing))
			continue
		}
		if preempted != "" {
			errs[i] = l.preempted(ctx, states, le, preempted)
			continue
		}
		sess[i] = name
	}
	renewed := map[string]error{}
	for _, i := range valid {
		if name := sess[i]; name != "" {
			if _, done := renewed[name]; !done {
				renewed[name] = l.renewFor(ctx, op, name)
			}
		}
	}
	for _, i := range valid {
		name := sess[i]
		if name == "" {
			continue
		}
		le := leases[i]
		lop := fmt.Sprintf("renew keys %q (fencing token %d)", le.Keys, le.Fence)
		if err := renewed[name]; err != nil {
			if errors.Is(err, lock.ErrLost) {
				errs[i] = l.lost(ctx, le, err.Error())
			} else {
				errs[i] = fmt.Errorf("%s: %w", lop, err)
			}
			continue
		}
		s, _, _ := l.ownSession(name)
		if s == nil || s.ttl != ttl {
			if s, err = l.move(ctx, lop, le, name, ttl); err != nil {
				errs[i] = err
				continue
			}
		}
		l.mu.Lock()
		until := s.valid
		l.mu.Unlock()
		next := *le
		next.TTL, next.Expires = ttl, until
		if !l.opts.Now().Before(until) {
			errs[i] = fmt.Errorf("%s: %w: the renewal took %v, leaving no validity of the %v TTL", lop, lock.ErrBackendUnavailable, l.opts.Since(until.Add(-ttl)), ttl)
			continue
		}
		out[i] = &next
	}
	return out, errs
}

// holdingSession is the session the holdings of lease's acquisition point
// at in states, or the first key it does not hold; and the first key whose
// holding a request with Preempt stopped ("" when none).
func holdingSession(states map[string]*keyLease, lease *lock.Lease) (session, missing, preempted string) {
	owner := digest(lease.Owner)
	for _, k := range lease.Keys {
		kl := states[k]
		i := -1
		if kl != nil {
			i = slices.IndexFunc(kl.st.Holders, func(h holding) bool {
				return h.Owner == owner && h.Fence == lease.Fence && h.mutex() == (lease.Limit <= 1)
			})
		}
		if i < 0 {
			return "", k, ""
		}
		if session == "" {
			session = kl.st.Holders[i].Session
		}
		if preempted == "" && kl.st.preempts(kl.st.Holders[i]) {
			preempted = k
		}
	}
	return session, "", preempted
}

// preempted reports lease preempted (on key) without renewing it, after
// moving its holdings in states to a session nobody renews (see freeze).
func (l *Locker) preempted(ctx context.Context, states map[string]*keyLease, lease *lock.Lease, key string) error {
	op := fmt.Sprintf("renew keys %q (fencing token %d)", lease.Keys, lease.Fence)
	if err := l.freeze(ctx, op, states, lease); err != nil {
		return err
	}
	l.opts.Log.V(1).Info("Lease preempted", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence, "key", key)
	return fmt.Errorf("%s: %w: a newer request waits for key %q and stopped this lease; it stays valid until %s, release it once the work has stopped", op, lock.ErrPreempted, key, lease.Expires.Format(time.RFC3339Nano))
}

// frozenPrefix starts the names of the sessions freeze creates.
const frozenPrefix = "lw-f-"

// frozen tells whether session name is one freeze created.
func frozen(name string) bool { return strings.HasPrefix(name, frozenPrefix) }

// freeze points the holdings of a preempted lease (as read in states) at a
// new session that nobody renews, so that renewals of the other leases of
// their session no longer extend them: they then last until a contender
// finds the new session unchanged for its whole TTL, which is the longest
// validity their sessions had left (this Locker's own; otherwise the
// lease's TTL) plus the drift allowance, so never less than the lease's
// own validity. Only the first renewal of a preempted lease freezes it (a
// session create and one write per key); later ones find its holdings
// frozen and write nothing, and a renewal racing with it leaves the
// holdings another one froze as they are.
func (l *Locker) freeze(ctx context.Context, op string, states map[string]*keyLease, lease *lock.Lease) error {
	owner := digest(lease.Owner)
	now := l.opts.Now()
	var ttl time.Duration
	for _, k := range lease.Keys {
		i := slices.IndexFunc(states[k].st.Holders, func(h holding) bool { return h.Owner == owner && h.Fence == lease.Fence })
		from := states[k].st.Holders[i].Session
		if frozen(from) {
			continue
		}
		left := lease.TTL
		if s, valid, ok := l.ownSession(from); ok {
			left = 0
			if now.Before(valid) {
				left = valid.Sub(now) + drift(s.ttl)
			}
		}
		ttl = max(ttl, left)
	}
	if ttl <= 0 {
		// Frozen already, or its sessions are no longer valid (contenders
		// take them as they would).
		return nil
	}
	to := &session{name: frozenPrefix + strings.TrimPrefix(newName(), "lw-s-"), ttl: ttl.Truncate(time.Millisecond) + time.Millisecond}
	cctx, cancel := l.callCtx(ctx)
	_, err := l.leases.Create(cctx, l.sessionObject(to, now), metav1.CreateOptions{})
	cancel()
	if err != nil {
		return apiError(op+": create the session of a preempted lease", err)
	}
	moved, err := l.repoint(ctx, op, lease, to.name, func(s string) bool { return !frozen(s) }, frozen)
	if err == nil && moved == 0 {
		// A racing renewal froze every holding first.
		l.dropFrozen(ctx, to.name)
	}
	return err
}

// dropFrozen deletes session name, one freeze created, once no holding
// points at it (best effort: sessions nobody renews are collected anyway).
func (l *Locker) dropFrozen(ctx context.Context, name string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.CleanupTimeout)
	defer cancel()
	if err := l.leases.Delete(cctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		l.opts.Log.V(2).Info("Deleting the session of a preempted lease failed; it is collected later", "session", name, "err", err.Error())
	}
}

// lost reports lease lost, releasing the keys it still holds (best effort):
// a lost lease is never held again behind its caller's back.
func (l *Locker) lost(ctx context.Context, lease *lock.Lease, why string) error {
	l.opts.Log.Info("Lease lost", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence, "why", why)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.CleanupTimeout)
	defer cancel()
	owner := digest(lease.Owner)
	for _, k := range lease.Keys {
		_ = l.removeHolding(cctx, "release a lost lease", k, owner, lease.Fence, nil)
	}
	return fmt.Errorf("renew keys %q (fencing token %d): %w: %s", lease.Keys, lease.Fence, lock.ErrLost, why)
}

// renewFor renews session name once: the Locker's own while it is valid,
// or another Locker's, taken over, while its last renewal (by its writer's
// clock) is less than a TTL old. The error matches lock.ErrLost when the
// session expired or was deleted.
func (l *Locker) renewFor(ctx context.Context, op, name string) error {
	l.smu.Lock()
	defer l.smu.Unlock()
	now := l.opts.Now()
	s, valid, ok := l.ownSession(name)
	if ok && !now.Before(valid) {
		l.abandon(s)
		return fmt.Errorf("%w: its session %s was not renewed within its TTL", lock.ErrLost, name)
	}
	if !ok {
		cctx, cancel := l.callCtx(ctx)
		obj, err := l.leases.Get(cctx, name, metav1.GetOptions{})
		cancel()
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: its session %s was deleted (a contender found it expired)", lock.ErrLost, name)
		}
		if err != nil {
			return apiError(op+": read session "+name, err)
		}
		ttl := sessionTTL(obj)
		last := obj.CreationTimestamp.Time
		if obj.Spec.RenewTime != nil {
			last = obj.Spec.RenewTime.Time
		}
		if !now.Before(last.Add(ttl)) {
			return fmt.Errorf("%w: its session %s was last renewed at %s, more than its TTL %v ago", lock.ErrLost, name, last.UTC().Format(time.RFC3339Nano), ttl)
		}
		s = &session{name: name, ttl: ttl, version: obj.ResourceVersion, valid: validUntil(last, ttl)}
		l.mu.Lock()
		l.sessions[name] = s
		l.mu.Unlock()
		l.opts.Log.V(1).Info("Took over a session to renew its leases", "session", name, "ttl", ttl.String())
	}
	err := l.renewSession(ctx, op, s)
	if errors.Is(err, errSessionGone) {
		l.mu.Lock()
		delete(l.sessions, name)
		if l.current[s.ttl] == s {
			delete(l.current, s.ttl)
		}
		l.mu.Unlock()
		return fmt.Errorf("%w: %w", lock.ErrLost, err)
	}
	return err
}

// move points the holdings of lease at the Locker's session of ttl, from
// session from (one write per key).
func (l *Locker) move(ctx context.Context, op string, lease *lock.Lease, from string, ttl time.Duration) (*session, error) {
	to, err := l.sessionFor(ctx, op, ttl)
	if err != nil {
		return nil, err
	}
	if _, err := l.repoint(ctx, op, lease, to.name, func(s string) bool { return s == from }, nil); err != nil {
		return nil, err
	}
	return to, nil
}

// repoint points the holdings of lease at session to (one write per key)
// and says how many moved: a holding on a session that from accepts moves,
// one on a session that stay accepts (nil: none) is left as it is; any
// other means the lease is lost (the error matches lock.ErrLost).
func (l *Locker) repoint(ctx context.Context, op string, lease *lock.Lease, to string, from, stay func(session string) bool) (int, error) {
	owner := digest(lease.Owner)
	moved := 0
	for _, k := range lease.Keys {
		found, move := false, false
		if err := l.update(ctx, op, k, func(st *state) bool {
			i := slices.IndexFunc(st.Holders, func(h holding) bool { return h.Owner == owner && h.Fence == lease.Fence })
			move = i >= 0 && from(st.Holders[i].Session)
			found = move || i >= 0 && stay != nil && stay(st.Holders[i].Session)
			if move {
				st.Holders[i].Session = to
			}
			return move
		}); err != nil {
			return moved, err
		}
		if move {
			moved++
		}
		if !found {
			return moved, l.lost(ctx, lease, fmt.Sprintf("key %q is no longer held by this acquisition", k))
		}
	}
	return moved, nil
}

// readKeys reads the Leases of keys: one read each, or one paged list of
// the store's key Leases when they are many.
func (l *Locker) readKeys(ctx context.Context, op string, keys []string) (map[string]*keyLease, error) {
	out := make(map[string]*keyLease, len(keys))
	if len(keys) <= listAbove {
		for _, k := range keys {
			kl, err := l.getOne(ctx, op, k)
			if err != nil {
				return nil, err
			}
			out[k] = kl
		}
		return out, nil
	}
	want := make(map[string]string, len(keys))
	for _, k := range keys {
		want[l.leaseName(k)] = k
		out[k] = &keyLease{key: k, st: state{Key: k}}
	}
	opts := metav1.ListOptions{LabelSelector: l.selector(roleKey), Limit: 500}
	for {
		cctx, cancel := l.callCtx(ctx)
		list, err := l.leases.List(cctx, opts)
		cancel()
		if err != nil {
			return nil, apiError(op+": list the keys' Leases", err)
		}
		for i := range list.Items {
			obj := &list.Items[i]
			k, ok := want[obj.Name]
			if !ok {
				continue
			}
			st, err := decode(k, obj)
			if err != nil {
				return nil, fmt.Errorf("%s: %w: %w", op, lock.ErrBackendUnavailable, err)
			}
			out[k] = &keyLease{key: k, obj: obj, st: st}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}

// selector selects the store's Leases of role.
func (l *Locker) selector(role string) string {
	return LabelStore + "=" + l.store + "," + LabelRole + "=" + role
}

// Release deletes the holdings of the lease's acquisition (see
// lock.Locker): one write per key. It returns an error matching
// lock.ErrNotHeld when none of them was still valid.
func (l *Locker) Release(ctx context.Context, lease *lock.Lease) error {
	if err := lock.ValidateLease(lease); err != nil {
		return err
	}
	if err := l.checkScopes("lease.keys", lease.Keys); err != nil {
		return err
	}
	op := fmt.Sprintf("release keys %q (fencing token %d)", lease.Keys, lease.Fence)
	if err := l.checkOpen(op); err != nil {
		return err
	}
	owner := digest(lease.Owner)
	cache := map[string]judgment{}
	released := 0
	// frozen are the sessions of the lease's preempted holdings (its own
	// alone, see freeze): nothing points at them once it is released.
	var frozenSessions []string
	for _, k := range lease.Keys {
		var held *holding
		if err := l.update(ctx, op, k, func(st *state) bool {
			i := slices.IndexFunc(st.Holders, func(h holding) bool {
				return h.Owner == owner && h.Fence == lease.Fence && h.mutex() == (lease.Limit <= 1)
			})
			if i < 0 {
				held = nil
				return false
			}
			h := st.Holders[i]
			held = &h
			st.Holders = slices.Delete(st.Holders, i, i+1)
			return true
		}); err != nil {
			return err
		}
		if held == nil {
			continue
		}
		if j, err := l.judge(ctx, op, held.Session, false, cache); err == nil && j.v == alive {
			released++
		}
		if frozen(held.Session) && !slices.Contains(frozenSessions, held.Session) {
			frozenSessions = append(frozenSessions, held.Session)
		}
	}
	for _, name := range frozenSessions {
		l.dropFrozen(ctx, name)
	}
	if released == 0 {
		return fmt.Errorf("%s: %w: the lease expired or another acquisition replaced it", op, lock.ErrNotHeld)
	}
	if v := l.opts.Log.V(1); v.Enabled() {
		v.Info("Released lease", "keys", lease.Keys, "holder", lease.Holder, "fence", lease.Fence)
	}
	return nil
}

// Dequeue removes owner from the FIFO queues of keys (a waiter giving up):
// one write per key it waited for.
func (l *Locker) Dequeue(ctx context.Context, keys []string, owner string) error {
	if err := lock.ValidateKeyList("keys", keys); err != nil {
		return err
	}
	if owner == "" {
		return &lock.InvalidRequestError{Field: "owner", Reason: "the owner token of the waiter is required"}
	}
	op := fmt.Sprintf("dequeue from keys %q", keys)
	if err := l.checkOpen(op); err != nil {
		return err
	}
	d := digest(owner)
	for _, k := range keys {
		if err := l.update(ctx, op, k, func(st *state) bool {
			i := position(st, d)
			if i < 0 {
				return false
			}
			st.Queue = slices.Delete(st.Queue, i, i+1)
			return true
		}); err != nil {
			return err
		}
	}
	return nil
}
