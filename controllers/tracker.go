package controllers

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/lockwarden/lockwarden/internal/watchdog"
)

// notifyBuffer bounds the reconcile requests waiting in a tracker's channel;
// when it is full, requests are dropped and the resync catches up.
const notifyBuffer = 1024

// tracker is what a reconciler of lease holders remembers between reconciles
// of one Kind: reconcile requests that come from the store or the watchdog rather
// than from informers, leases the watchdog lost, and when holders started
// waiting. The zero value is not usable; use newTracker.
type tracker struct {
	kind   string
	newObj func() client.Object
	notify chan event.GenericEvent

	mu           sync.Mutex
	lost         map[types.NamespacedName]watchdog.Lost
	waitingSince map[types.NamespacedName]time.Time
}

func newTracker(kind string, newObj func() client.Object) *tracker {
	return &tracker{
		kind:         kind,
		newObj:       newObj,
		notify:       make(chan event.GenericEvent, notifyBuffer),
		lost:         map[types.NamespacedName]watchdog.Lost{},
		waitingSince: map[types.NamespacedName]time.Time{},
	}
}

// source delivers the tracker's reconcile requests to a controller.
func (t *tracker) source() source.Source {
	return source.Channel(t.notify, &handler.EnqueueRequestForObject{})
}

// enqueue asks for a reconcile of one object.
func (t *tracker) enqueue(nn types.NamespacedName) {
	obj := t.newObj()
	obj.SetNamespace(nn.Namespace)
	obj.SetName(nn.Name)
	select {
	case t.notify <- event.GenericEvent{Object: obj}:
	default:
	}
}

// enqueueWait asks for a reconcile of one object, waiting for room in the
// channel rather than dropping the request, until ctx ends: for callers in
// their own goroutine that may ask for many at once (the status resync).
func (t *tracker) enqueueWait(ctx context.Context, nn types.NamespacedName) {
	obj := t.newObj()
	obj.SetNamespace(nn.Namespace)
	obj.SetName(nn.Name)
	select {
	case t.notify <- event.GenericEvent{Object: obj}:
	case <-ctx.Done():
	}
}

// onLost is the watchdog's callback: it remembers a lost lease of this Kind
// and asks for a reconcile, which reports it.
func (t *tracker) onLost(l watchdog.Lost) {
	if l.Ref.Kind != t.kind {
		return
	}
	nn := types.NamespacedName{Namespace: l.Ref.Namespace, Name: l.Ref.Name}
	t.recordLost(nn, l)
	t.enqueue(nn)
}

// recordLost remembers a lost lease of nn until clearLost.
func (t *tracker) recordLost(nn types.NamespacedName, l watchdog.Lost) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lost[nn] = l
}

// lostOf returns the lost lease of nn the watchdog reported, if any. It
// stays until clearLost: a reconcile whose write fails sees it again.
func (t *tracker) lostOf(nn types.NamespacedName) (watchdog.Lost, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.lost[nn]
	return l, ok
}

// clearLost forgets the lost lease l of nn once what shows it was written;
// a newer loss reported meanwhile is kept.
func (t *tracker) clearLost(nn types.NamespacedName, l watchdog.Lost) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.lost[nn]; ok && cur.Lease == l.Lease {
		delete(t.lost, nn)
	}
}

// startWaiting records that nn waits since now, unless it already did;
// it reports whether this is the first time.
func (t *tracker) startWaiting(nn types.NamespacedName, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.waitingSince[nn]; ok {
		return false
	}
	t.waitingSince[nn] = now
	return true
}

// stopWaiting forgets that nn waits and returns since when it did (or fallback).
func (t *tracker) stopWaiting(nn types.NamespacedName, fallback time.Time) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	since, ok := t.waitingSince[nn]
	delete(t.waitingSince, nn)
	if !ok {
		return fallback
	}
	return since
}

// forget drops everything remembered about nn.
func (t *tracker) forget(nn types.NamespacedName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.lost, nn)
	delete(t.waitingSince, nn)
}
