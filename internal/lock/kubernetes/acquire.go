package kubernetes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// maxConflicts bounds the attempts one call makes when the Leases it
// writes keep changing under it.
const maxConflicts = 8

// check checks a prepared request against the store's own limits (see
// lock.Acquisitions).
func (l *Locker) check(req lock.Request) error {
	if req.Limit > MaxHolders {
		return &lock.InvalidRequestError{Field: "limit", Reason: fmt.Sprintf("%d holders requested, at most %d on the kubernetes store (every holder is stored in the key's Lease)", req.Limit, MaxHolders)}
	}
	return l.checkScopes("keys", req.Keys)
}

// wait is Acquire (lock.Acquisitions) once req is prepared: it blocks until it
// holds every key of req or ctx ends (see
// lock.Locker), woken by a watch of the keys' Leases.
func (l *Locker) wait(ctx context.Context, req lock.Request) (*lock.Lease, error) {
	return lock.AcquireOnReleases(ctx, &l.opts.Options, req,
		func(ctx context.Context) (*lock.Lease, time.Duration, error) { return l.attempt(ctx, req) },
		l.Watch, l.Dequeue)
}

// TryAcquire (lock.Acquisitions, over attempt) makes one attempt to take every
// key of req (see lock.Locker;
// the rules are the memory store's). With req.Queue a request that cannot
// take the keys joins (or keeps its place in) every key's queue.
//
// attempt is one acquisition of the prepared req; a refusal tells how long
// the busy key's first holder has left at most (0: unknown).
func (l *Locker) attempt(ctx context.Context, req lock.Request) (*lock.Lease, time.Duration, error) {
	op := fmt.Sprintf("acquire keys %q", req.Keys)
	if err := l.checkOpen(op); err != nil {
		return nil, 0, err
	}
	l.takeBackOrphans(ctx)
	l.collectSessions(ctx)
	start := l.opts.Now()
	for range maxConflicts {
		lease, within, err := l.try(ctx, op, req, start)
		if !errors.Is(err, errConflict) {
			return lease, within, err
		}
	}
	return nil, 0, fmt.Errorf("%s: %w: the keys' Leases changed under each of %d attempts (many contenders); try again", op, lock.ErrNotAcquired, maxConflicts)
}

// try reads the keys, and takes them or joins their queues.
func (l *Locker) try(ctx context.Context, op string, req lock.Request, start time.Time) (*lock.Lease, time.Duration, error) {
	owner := digest(req.Owner)
	kls, err := l.get(ctx, op, req.Keys)
	if err != nil {
		return nil, 0, err
	}
	cache := map[string]judgment{}
	now := l.opts.Now()
	for _, kl := range kls {
		if err := l.prune(ctx, op, kl, now, cache); err != nil {
			return nil, 0, err
		}
	}
	for _, kl := range kls {
		if kl.st.replacedMark(owner) {
			return nil, 0, fmt.Errorf("%s: %w: a newer request took its place in the queue of key %q", op, lock.ErrReplaced, kl.key)
		}
	}
	if req.Replace {
		l.replaceOlder(kls, owner, now)
	}
	if req.Preempt {
		preempt(kls, owner)
	}
	limit, weight := req.Holders(), req.Slots()
	for _, kl := range kls {
		if !busyFor(&kl.st, owner, limit, weight) {
			continue
		}
		if req.Queue {
			if err := l.join(ctx, op, kls, req, owner, now); err != nil {
				return nil, 0, err
			}
		}
		he := &lock.HeldError{Key: kl.key, Position: position(&kl.st, owner), Waiters: len(kl.st.Queue), Holders: len(kl.st.Holders)}
		var within time.Duration
		for i, h := range kl.st.Holders {
			if i == 0 {
				he.Holder, he.Fence = h.Holder, h.Fence
			}
			if w := cache[h.Session].within; w > 0 && (within == 0 || w < within) {
				within = w
			}
		}
		return nil, within, he
	}

	// Every key is free for the request: one token, larger than every
	// token issued for any of its keys.
	var fence int64
	for _, kl := range kls {
		fence = max(fence, kl.st.Fence)
	}
	fence++
	if fence >= lock.MaxFence {
		return nil, 0, fmt.Errorf("%s: fencing token %d would reach the bound of %d (tokens are below lock.MaxFence)", op, fence, lock.MaxFence)
	}
	s, err := l.sessionFor(ctx, op, req.TTL)
	if err != nil {
		return nil, 0, err
	}
	mutex := limit <= 1
	var written []*keyLease
	// places are the queue entries the acquisition removes, to put back
	// if it has to take the keys back.
	places := map[string]waiter{}
	for _, kl := range l.byName(kls) {
		kl.st.Holders = slices.DeleteFunc(kl.st.Holders, func(h holding) bool { return h.Owner == owner && h.mutex() == mutex })
		kl.st.Holders = append(kl.st.Holders, holding{Owner: owner, Holder: req.Holder, Fence: fence, Limit: limit, Session: s.name, Acquired: now.UnixMilli(), Weight: storedWeight(req)})
		kl.st.Fence = fence
		if i := position(&kl.st, owner); i >= 0 {
			places[kl.key] = kl.st.Queue[i]
			kl.st.Queue = slices.Delete(kl.st.Queue, i, i+1)
		}
		if err := l.put(ctx, op, kl); err != nil {
			// Another writer came first (or the API failed): take back
			// what this attempt took, and try again or give up.
			l.takeBack(ctx, op, written, owner, fence, places)
			return nil, 0, err
		}
		written = append(written, kl)
	}
	l.mu.Lock()
	valid := validUntil(start, req.TTL)
	if s.valid.Before(valid) {
		valid = s.valid
	}
	l.mu.Unlock()
	lease := lock.NewLease(req, fence, start, valid)
	if elapsed := l.opts.Since(start); !l.opts.Now().Before(lease.Expires) {
		l.takeBack(ctx, op, written, owner, fence, places)
		return nil, 0, fmt.Errorf("%s: %w: the call took %v, leaving no validity of the %v TTL (drift allowance %v)", op, lock.ErrBackendUnavailable, elapsed, req.TTL, drift(req.TTL))
	}
	if v := l.opts.Log.V(1); v.Enabled() {
		v.Info("Acquired lease", "keys", req.Keys, "holder", req.Holder, "fence", fence, "session", s.name)
	}
	return lease, 0, nil
}

// byName orders kls by Lease name: every acquisition writes keys in this
// order, so two of them meet at their first common key.
func (l *Locker) byName(kls []*keyLease) []*keyLease {
	out := slices.Clone(kls)
	slices.SortFunc(out, func(a, b *keyLease) int { return cmp.Compare(l.leaseName(a.key), l.leaseName(b.key)) })
	return out
}

// prune drops from kl the holdings whose sessions are gone (deleting the
// ones found expired), the waiters past their deadline and the replacement
// marks past theirs.
func (l *Locker) prune(ctx context.Context, op string, kl *keyLease, now time.Time, cache map[string]judgment) error {
	var dead []string
	for _, h := range kl.st.Holders {
		j, err := l.judge(ctx, op, h.Session, true, cache)
		if err != nil {
			return err
		}
		if j.v == gone {
			dead = append(dead, h.Session)
		}
	}
	kl.st.Holders = slices.DeleteFunc(kl.st.Holders, func(h holding) bool { return slices.Contains(dead, h.Session) })
	ms := now.UnixMilli()
	kl.st.Queue = slices.DeleteFunc(kl.st.Queue, func(w waiter) bool { return w.Until < ms })
	kl.st.Replaced = slices.DeleteFunc(kl.st.Replaced, func(m mark) bool { return m.Until < ms })
	return nil
}

// replaceOlder applies Request.Replace to the pruned states kls, which the
// attempt then writes (its join or its acquisition): the waiters that
// joined before owner (a smaller ticket, whatever their rank; everyone
// queued when it has no place) leave the queues, and their owners are
// marked replaced for two waiter TTLs.
func (l *Locker) replaceOlder(kls []*keyLease, owner string, now time.Time) {
	// owner's place: its ticket is the same on every key it joined (the
	// largest when a join was cut short, as join takes it).
	var mine *waiter
	for _, kl := range kls {
		if i := position(&kl.st, owner); i >= 0 && (mine == nil || arrivalOrder(kl.st.Queue[i], *mine) > 0) {
			w := kl.st.Queue[i]
			mine = &w
		}
	}
	until := now.Add(2 * l.opts.WaiterTTL).UnixMilli()
	for _, kl := range kls {
		st := &kl.st
		st.Queue = slices.DeleteFunc(st.Queue, func(w waiter) bool {
			if w.Owner == owner || mine != nil && arrivalOrder(w, *mine) >= 0 {
				return false
			}
			st.Replaced = slices.DeleteFunc(st.Replaced, func(m mark) bool { return m.Owner == w.Owner })
			st.Replaced = append(st.Replaced, mark{Owner: w.Owner, Until: until})
			return true
		})
	}
}

// preempt applies Request.Preempt to the pruned states kls: every holding
// of another owner is stopped (the key's preemption mark rises to its
// token). A key held by others refuses the request, whose join writes it.
func preempt(kls []*keyLease, owner string) {
	for _, kl := range kls {
		for _, h := range kl.st.Holders {
			if h.Owner != owner {
				kl.st.Preempted = max(kl.st.Preempted, h.Fence)
			}
		}
	}
}

// busyFor tells whether st (pruned) refuses a request of owner for limit
// holders that takes weight slots: the memory store's rule (see package
// lock/memory).
func busyFor(st *state, owner string, limit, weight int) bool {
	if limit <= 1 {
		switch {
		case len(st.Holders) > 1:
			return true
		case len(st.Holders) == 1:
			h := st.Holders[0]
			// Only the owner's own mutex lease leaves the key to it, queue
			// or not; unless it was preempted and others wait.
			return !h.mutex() || h.Owner != owner ||
				(st.preempts(h) && slices.ContainsFunc(st.Queue, func(w waiter) bool { return w.Owner != owner }))
		default:
			return len(st.Queue) > 0 && st.Queue[0].Owner != owner
		}
	}
	if slices.ContainsFunc(st.Holders, holding.mutex) {
		return true
	}
	if slices.ContainsFunc(st.Holders, func(h holding) bool { return h.Owner == owner }) {
		return false
	}
	// Every holder keeps its own bound: no more slots taken than the
	// smallest limit among the request's and the holders'. Strict FIFO by
	// weight: the request fits only with the weights of every waiter
	// ahead of it (all of them when it is not queued). Holdings and
	// waiters written before Request.Weight take one slot each.
	eff, used := limit, 0
	for _, h := range st.Holders {
		eff = min(eff, h.Limit)
		used += h.slots()
	}
	pos := position(st, owner)
	if pos < 0 {
		pos = len(st.Queue)
	}
	ahead := 0
	for _, w := range st.Queue[:pos] {
		ahead += w.slots()
	}
	return used+ahead+weight > eff
}

// position is owner's place in st's queue (0: the head), or -1.
func position(st *state, owner string) int {
	return slices.IndexFunc(st.Queue, func(w waiter) bool { return w.Owner == owner })
}

// join puts req's owner in every key's queue, or keeps its place there
// with a new deadline and req's weight, and writes the keys. Its place is
// the one it has on any key already (the latest ticket, with its boost),
// or else a new ticket, its arrival (see arrival), with req.Boost as its
// head start.
func (l *Locker) join(ctx context.Context, op string, kls []*keyLease, req lock.Request, owner string, now time.Time) error {
	var place *waiter
	for _, kl := range kls {
		if i := position(&kl.st, owner); i >= 0 && (place == nil || kl.st.Queue[i].Ticket > place.Ticket) {
			w := kl.st.Queue[i]
			place = &w
		}
	}
	if place == nil {
		place = &waiter{Ticket: arrival(kls, now), Boost: req.Boost.Microseconds()}
	}
	until := now.Add(l.opts.WaiterTTL).UnixMilli()
	for _, kl := range l.byName(kls) {
		if i := position(&kl.st, owner); i >= 0 {
			w := &kl.st.Queue[i]
			w.Ticket, w.Boost, w.Until, w.Weight = place.Ticket, place.Boost, until, storedWeight(req)
		} else {
			if len(kl.st.Queue) >= MaxQueue {
				return fmt.Errorf("%s: %w: key %q has %d waiters already, the most the kubernetes store keeps in one Lease", op, lock.ErrNotAcquired, kl.key, len(kl.st.Queue))
			}
			kl.st.Queue = append(kl.st.Queue, waiter{Owner: owner, Holder: req.Holder, Ticket: place.Ticket, Boost: place.Boost, Since: now.UnixMilli(), Until: until, Weight: storedWeight(req)})
		}
		kl.st.Arrival = max(kl.st.Arrival, place.Ticket)
		sortQueue(kl.st.Queue)
		if err := l.put(ctx, op, kl); err != nil {
			return err
		}
	}
	return nil
}

// arrival is the ticket of a new waiter on kls: now (Unix ns, the
// joiner's clock), or else just after the last arrival on any of the keys
// and every ticket in their queues, so that tickets never go back on a
// key whatever the clocks of the Lockers that join it (equal boosts are
// served in the order their joins were written), and a new waiter comes
// after the ones queued by a Locker that predates the last arrival.
func arrival(kls []*keyLease, now time.Time) int64 {
	last := int64(0)
	for _, kl := range kls {
		last = max(last, kl.st.Arrival)
		for _, w := range kl.st.Queue {
			last = max(last, w.Ticket)
		}
	}
	return max(now.UnixNano(), last+1)
}

// takeBack removes the holdings (owner, fence) an acquisition wrote to
// kls and puts back the places in their queues it took (by key); what it
// cannot take back is kept as an orphan, taken back at
// the next chance (until then the holding lives as long as its session).
func (l *Locker) takeBack(ctx context.Context, op string, kls []*keyLease, owner string, fence int64, places map[string]waiter) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.CleanupTimeout)
	defer cancel()
	for _, kl := range kls {
		if err := l.removeHolding(cctx, op, kl.key, owner, fence, func(st *state) {
			if w, ok := places[kl.key]; ok && position(st, owner) < 0 {
				st.Queue = append(st.Queue, w)
				sortQueue(st.Queue)
			}
		}); err != nil {
			l.opts.Log.V(1).Info("Taking back a partial acquisition failed; trying again later", "key", kl.key, "fence", fence, "err", err.Error())
			l.mu.Lock()
			l.orphans = append(l.orphans, orphan{key: kl.key, owner: owner, fence: fence})
			l.mu.Unlock()
		}
	}
}

// takeBackOrphans retries the holdings takeBack could not remove.
func (l *Locker) takeBackOrphans(ctx context.Context) {
	l.mu.Lock()
	orphans := l.orphans
	l.orphans = nil
	l.mu.Unlock()
	for _, o := range orphans {
		if err := l.removeHolding(ctx, "take back a partial acquisition", o.key, o.owner, o.fence, nil); err != nil {
			l.mu.Lock()
			l.orphans = append(l.orphans, o)
			l.mu.Unlock()
		}
	}
}

// removeHolding deletes the holding (owner, fence) of key, applying also
// to the state (nil: nothing else), and says whether it was there.
func (l *Locker) removeHolding(ctx context.Context, op, key, owner string, fence int64, also func(*state)) error {
	return l.update(ctx, op, key, func(st *state) bool {
		i := slices.IndexFunc(st.Holders, func(h holding) bool { return h.Owner == owner && h.Fence == fence })
		if i < 0 {
			return false
		}
		st.Holders = slices.Delete(st.Holders, i, i+1)
		if also != nil {
			also(st)
		}
		return true
	})
}

// update reads key's Lease, applies change (false: nothing to write) and
// writes it on the version read, again while another writer comes first.
func (l *Locker) update(ctx context.Context, op, key string, change func(*state) bool) error {
	for range maxConflicts {
		kl, err := l.getOne(ctx, op, key)
		if err != nil {
			return err
		}
		if kl.obj == nil || !change(&kl.st) {
			return nil
		}
		if err = l.put(ctx, op, kl); !errors.Is(err, errConflict) {
			return err
		}
	}
	return fmt.Errorf("%s: %w: the Lease of key %q changed under each of %d attempts", op, lock.ErrBackendUnavailable, key, maxConflicts)
}

// sortQueue orders a queue by rank (see waiterOrder).
func sortQueue(q []waiter) {
	slices.SortStableFunc(q, waiterOrder)
}

// waiterOrder is the queues' order: by rank (arrival less the head start,
// Request.Boost), then by arrival.
func waiterOrder(a, b waiter) int {
	return cmp.Or(cmp.Compare(a.rank(), b.rank()), arrivalOrder(a, b))
}

// arrivalOrder is the order in which waiters joined: by ticket, and owner
// among equal tickets. Request.Replace drops the waiters that joined
// before it, whatever their rank.
func arrivalOrder(a, b waiter) int {
	return cmp.Or(cmp.Compare(a.Ticket, b.Ticket), cmp.Compare(a.Owner, b.Owner))
}
