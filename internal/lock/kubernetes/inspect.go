package kubernetes

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Inspect reports what the Leases hold for each key (see lock.KeyState):
// the holders whose sessions this Locker does not know to be expired,
// oldest first, with the slots each takes (1 for a holding written
// without a weight), their times on this Locker's clock (Expires is when the
// session expires unless renewed, as far as this Locker can tell), and the
// waiters whose deadline has not passed. It writes nothing.
func (l *Locker) Inspect(ctx context.Context, keys []string) ([]lock.KeyState, error) {
	if err := lock.ValidateKeyList("keys", keys); err != nil {
		return nil, err
	}
	op := fmt.Sprintf("inspect keys %q", keys)
	if err := l.checkOpen(op); err != nil {
		return nil, err
	}
	kls, err := l.get(ctx, op, keys)
	if err != nil {
		return nil, err
	}
	return l.keyStates(ctx, op, kls, map[string]judgment{})
}

// InspectMany reports what Inspect would for each set of keys (see
// lock.BatchInspector), reading every key once: one paged list of the
// store's key Leases when they are many, so that refreshing the status of
// thousands of locks does not cost a read per lock. An invalid set fails
// alone.
func (l *Locker) InspectMany(ctx context.Context, keys [][]string) ([][]lock.KeyState, []error) {
	out := make([][]lock.KeyState, len(keys))
	errs := make([]error, len(keys))
	var valid []int
	var all []string
	for i, k := range keys {
		if err := lock.ValidateKeyList(fmt.Sprintf("keys[%d]", i), k); err != nil {
			errs[i] = err
			continue
		}
		valid = append(valid, i)
		all = append(all, k...)
	}
	if len(valid) == 0 {
		return out, errs
	}
	op := fmt.Sprintf("inspect the keys of %d locks", len(valid))
	fail := func(err error) ([][]lock.KeyState, []error) {
		for _, i := range valid {
			errs[i] = err
		}
		return out, errs
	}
	if err := l.checkOpen(op); err != nil {
		return fail(err)
	}
	slices.Sort(all)
	read, err := l.readKeys(ctx, op, slices.Compact(all))
	if err != nil {
		return fail(err)
	}
	cache := map[string]judgment{}
	for _, i := range valid {
		kls := make([]*keyLease, len(keys[i]))
		for j, k := range keys[i] {
			kls[j] = read[k]
		}
		out[i], errs[i] = l.keyStates(ctx, op, kls, cache)
	}
	return out, errs
}

// keyStates turns the keys' Leases into what Inspect reports, judging
// each holder's session once per cache.
func (l *Locker) keyStates(ctx context.Context, op string, kls []*keyLease, cache map[string]judgment) ([]lock.KeyState, error) {
	now := l.opts.Now()
	out := make([]lock.KeyState, len(kls))
	for i, kl := range kls {
		st := lock.KeyState{Key: kl.key, Fence: kl.st.Fence}
		for _, h := range kl.st.Holders {
			j, err := l.judge(ctx, op, h.Session, false, cache)
			if err != nil {
				return nil, err
			}
			if j.v != alive {
				continue
			}
			st.HolderCount++
			if len(st.Holders) < lock.MaxInspectHolders {
				st.Holders = append(st.Holders, lock.HolderState{Holder: h.Holder, Fence: h.Fence, Acquired: time.UnixMilli(h.Acquired), Expires: j.expires, Weight: h.slots()})
			}
		}
		slices.SortFunc(st.Holders, func(a, b lock.HolderState) int { return cmp.Compare(a.Fence, b.Fence) })
		if len(st.Holders) > 0 {
			h := st.Holders[0]
			st.Held, st.Holder, st.Fence, st.Acquired, st.Expires = true, h.Holder, h.Fence, h.Acquired, h.Expires
		}
		for _, w := range kl.st.Queue {
			if w.Until < now.UnixMilli() {
				continue
			}
			st.Queued++
			if len(st.Waiters) < lock.MaxInspectWaiters {
				st.Waiters = append(st.Waiters, lock.Waiter{Holder: w.Holder, Since: time.UnixMilli(w.Since)})
			}
		}
		out[i] = st
	}
	return out, nil
}

// watchBuffer is how many notifications a Watch channel buffers; beyond
// that they are dropped (a waiter polls too), so a slow reader never holds
// up the watch.
const watchBuffer = 64

// Watch delivers the keys (with no keys: every key of the store) whose
// Lease lost a holder or a queue head, from a watch of the Leases, until
// ctx ends or the Locker is closed (see lock.Locker). Expiry writes
// nothing, so it is not delivered: a waiter also polls. When the watch
// breaks it is opened again, and every watched key is delivered (a release
// may have been missed).
func (l *Locker) Watch(ctx context.Context, keys ...string) (<-chan string, error) {
	if len(keys) > 0 {
		if err := lock.ValidateKeyList("keys", keys); err != nil {
			return nil, err
		}
	}
	op := fmt.Sprintf("watch keys %q", keys)
	if err := l.checkOpen(op); err != nil {
		return nil, err
	}
	names := map[string]string{}
	for _, k := range keys {
		names[l.leaseName(k)] = k
	}
	opts := metav1.ListOptions{LabelSelector: l.selector(roleKey)}
	if len(keys) == 1 {
		opts.FieldSelector = fields.OneTermEqualSelector("metadata.name", l.leaseName(keys[0])).String()
	}
	w, err := l.leases.Watch(ctx, opts)
	if err != nil {
		return nil, apiError(op, err)
	}
	ch := make(chan string, watchBuffer)
	go l.watchLoop(ctx, opts, w, names, ch)
	return ch, nil
}

// shape is what a Watch compares between two versions of a key's Lease.
type shape struct {
	holders int
	head    string
	// replaced are the replacement marks: a new one wakes the waiters to
	// learn that they were dropped (one that lapses wakes nobody).
	replaced []mark
}

// newMark tells whether cur has a replacement mark prev had not.
func (cur shape) newMark(prev shape) bool {
	return slices.ContainsFunc(cur.replaced, func(m mark) bool { return !slices.Contains(prev.replaced, m) })
}

func (l *Locker) watchLoop(ctx context.Context, opts metav1.ListOptions, w watch.Interface, names map[string]string, ch chan<- string) {
	defer close(ch)
	last := map[string]shape{}
	send := func(key string) {
		select {
		case ch <- key:
		default:
			l.opts.Log.V(2).Info("Dropped a release notification: the watcher is not reading", "key", key)
		}
	}
	for {
		if !l.drain(ctx, w, names, last, send) {
			return
		}
		// The watch broke: open it again, and deliver every watched key.
		for {
			timer, stop := l.opts.NewTimer(time.Second)
			select {
			case <-ctx.Done():
				stop()
				return
			case <-l.closed:
				stop()
				return
			case <-timer:
			}
			var err error
			if w, err = l.leases.Watch(ctx, opts); err == nil {
				break
			}
			l.opts.Log.V(2).Info("Watching the Leases failed; trying again", "err", err.Error())
		}
		for _, k := range names {
			send(k)
		}
	}
}

// drain delivers w's events until it ends (true) or ctx or the Locker does
// (false).
func (l *Locker) drain(ctx context.Context, w watch.Interface, names map[string]string, last map[string]shape, send func(string)) bool {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-l.closed:
			return false
		case ev, ok := <-w.ResultChan():
			if !ok {
				return true
			}
			obj, isLease := ev.Object.(*coordinationv1.Lease)
			if !isLease {
				if ev.Type == watch.Error {
					return true
				}
				continue
			}
			l.event(ev.Type, obj, names, last, send)
		}
	}
}

// event delivers the key of a changed Lease that lost a holder or its
// queue head, or whose waiters a newer request replaced.
func (l *Locker) event(t watch.EventType, obj *coordinationv1.Lease, names map[string]string, last map[string]shape, send func(string)) {
	var st state
	key, watched := names[obj.Name]
	if raw := obj.Annotations[AnnotationState]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &st); err != nil {
			return
		}
	}
	if len(names) == 0 {
		key, watched = st.Key, true
	}
	if !watched || key == "" {
		return
	}
	prev, known := last[obj.Name]
	cur := shape{holders: len(st.Holders), replaced: st.Replaced}
	if len(st.Queue) > 0 {
		cur.head = st.Queue[0].Owner
	}
	if t == watch.Deleted {
		delete(last, obj.Name)
		send(key)
		return
	}
	last[obj.Name] = cur
	if t == watch.Added || !known {
		return
	}
	if cur.holders < prev.holders || cur.head != prev.head && cur.holders == 0 || cur.newMark(prev) {
		send(key)
	}
}

// Ping is the health check the operator's backend registry makes: one
// list of at most one of the store's Leases, which also checks that the
// operator may read them.
func (l *Locker) Ping(ctx context.Context) error {
	if err := l.checkOpen("ping"); err != nil {
		return err
	}
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	if _, err := l.leases.List(cctx, metav1.ListOptions{LabelSelector: l.selector(roleKey), Limit: 1}); err != nil {
		return apiError("ping", err)
	}
	return nil
}
