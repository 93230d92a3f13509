package controllers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/metrics"
)

// forceRelease carries out a lockwarden.io/force-release request: it takes
// the lease with that fencing token away from its holder, if a holder of
// this lock in this cluster holds it, records who asked (from the admission
// webhook's lockwarden.io/force-release-by, which its seal must match) in
// Events on the lock and the holding Job, and removes the request. The
// holder finds its lease lost at its next renewal (onLost applies). It
// returns an error only when the request could not be removed; a request it
// refuses is removed with a Warning Event that says why.
func (r *DistributedLockReconciler) forceRelease(ctx context.Context, dl *locksv1alpha1.DistributedLock, obs *observation) error {
	token, asked := dl.Annotations[locksv1alpha1.AnnotationForceRelease]
	if !asked {
		return nil
	}
	log := logf.FromContext(ctx)
	by := dl.Annotations[locksv1alpha1.AnnotationForceReleaseBy]
	seal := dl.Annotations[locksv1alpha1.AnnotationForceReleaseSeal]
	refuse := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		r.Recorder.Eventf(dl, nil, corev1.EventTypeWarning, locksv1alpha1.EventForceReleaseRefused, "ForceRelease", "%s", msg)
		log.Info("Refused a force release", "token", token, "by", by, "reason", msg)
	}
	fence, err := strconv.ParseInt(token, 10, 64)
	switch {
	case by == "":
		refuse("%s=%s was not recorded by the admission webhook (%s is missing), so who asked is unknown: nothing was released",
			locksv1alpha1.AnnotationForceRelease, token, locksv1alpha1.AnnotationForceReleaseBy)
	case !r.Tokens.VerifyForceReleaseSeal(dl.Namespace, dl.Name, token, by, seal):
		// Written by hand where the webhook does not run (a namespace it
		// skips, or while it was not installed), or copied from another
		// request: who asked is unknown, whatever the record says.
		refuse("%s=%s was not recorded by the admission webhook (%s is missing or does not match the request), so who asked is unknown: nothing was released",
			locksv1alpha1.AnnotationForceRelease, token, locksv1alpha1.AnnotationForceReleaseSeal)
	case err != nil || fence <= 0:
		refuse("%s=%q is not a fencing token: nothing was released", locksv1alpha1.AnnotationForceRelease, token)
	case !obs.ready():
		// The backend cannot be asked now: keep the request for later.
		return nil
	default:
		r.releaseByToken(ctx, dl, obs, fence, by, refuse)
	}
	before := dl.DeepCopy()
	delete(dl.Annotations, locksv1alpha1.AnnotationForceRelease)
	delete(dl.Annotations, locksv1alpha1.AnnotationForceReleaseBy)
	delete(dl.Annotations, locksv1alpha1.AnnotationForceReleaseSeal)
	if err := r.Client.Patch(ctx, dl, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("remove the force-release request of %s: %w", client.ObjectKeyFromObject(dl), err)
	}
	return nil
}

// releaseByToken releases the lease of this lock's holder with the given fencing token.
func (r *DistributedLockReconciler) releaseByToken(ctx context.Context, dl *locksv1alpha1.DistributedLock, obs *observation, fence int64, by string, refuse func(string, ...any)) {
	var found *lock.HolderState
	var others []string
	// A lease of fixed keys holds every key: the first key's holders are
	// all of them. A lock that derives keys has a lease per key: the
	// token is looked for on each key in use, and released on its key.
	states, keys := obs.states, obs.keys
	if dl.Spec.KeyFrom == nil && len(states) > 1 {
		states = states[:1]
	}
search:
	for _, s := range states {
		for _, hs := range holdersOf(s) {
			h := holder.Decode(hs.Holder)
			if hs.Fence == fence && h.Of(r.ClusterName, dl.Namespace, dl.Name) {
				found = &hs
				if dl.Spec.KeyFrom != nil {
					keys = []string{s.Key}
				}
				break search
			}
			if len(others) < maxHoldersInStatus {
				others = append(others, fmt.Sprintf("%s (%d)", h.Shown().Identity, hs.Fence))
			}
		}
	}
	if found == nil {
		held := "nobody holds the keys"
		if len(others) > 0 {
			held = "holders: " + strings.Join(others, ", ")
		}
		refuse("%s asked to release fencing token %d, but no holder that acquired through this lock in this cluster has it (%s): nothing was released", by, fence, held)
		return
	}
	h := holder.Decode(found.Holder)
	l := &lock.Lease{Keys: keys, Owner: r.Tokens.Owner(h), Holder: found.Holder, Fence: fence, Limit: maxHolders(dl)}
	err := obs.handle.Locker.Release(ctx, l)
	switch {
	case err == nil:
	case errors.Is(err, lock.ErrNotHeld):
		refuse("%s asked to release fencing token %d of %s, but the lease had already ended", by, fence, h.Shown().Identity)
		return
	default:
		refuse("%s asked to release fencing token %d of %s, but the backend failed: %s; nothing was released, ask again", by, fence, h.Shown().Identity, backend.Describe(err))
		return
	}
	metrics.ForceReleases.WithLabelValues(h.Kind).Inc()
	msg := fmt.Sprintf("%s force-released the lease of %s (fencing token %d); the holder has lost the lock (onLost: %s)", by, h.Shown().Identity, fence, dl.Spec.OnLost)
	if h.Kind == lockKind {
		msg += "; the manual holder waits for the lock again: remove spec.holder to end its hold"
	}
	r.Recorder.Eventf(dl, nil, corev1.EventTypeWarning, locksv1alpha1.EventForceReleased, "ForceRelease", "%s", msg)
	logf.FromContext(ctx).Info("Force-released a lease", "by", by, "holder", h.Identity, "fence", fence)
	if h.Kind == "Job" {
		var job batchv1.Job
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: h.Namespace, Name: h.Name}, &job); err == nil {
			r.Recorder.Eventf(&job, dl, corev1.EventTypeWarning, locksv1alpha1.EventForceReleased, "ForceRelease", "%s", msg)
		}
	}
	if refreshed, err := obs.handle.Locker.Inspect(ctx, obs.keys); err == nil {
		obs.states = refreshed
	}
}
