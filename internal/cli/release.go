package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/printable"
)

type releaseOptions struct {
	*options
	force bool
	token int64
}

func newReleaseCommand(o *options) *cobra.Command {
	ro := &releaseOptions{options: o}
	cmd := &cobra.Command{
		Use:   "release LOCK --force [--token N]",
		Short: "Ask the operator to take the lease away from a lock's holder (audited)",
		Long: `release --force asks the operator to take a lease away from a holder of the
lock: it sets the lock's annotation lockwarden.io/force-release to the holder's
fencing token (the current one from status.fencingToken, or --token for one of
the holders in status.holders). Nothing else is changed.

The request is audited: the admission webhook records who set it in
lockwarden.io/force-release-by and seals that record (any value you set
there is replaced, and a record the webhook did not seal is refused), the
operator releases the lease, records the Event ForceReleased naming who asked,
which holder and which token, and removes the annotations. The holder is
treated as having lost its lease (the lock's onLost applies). The operator
refuses, with a ForceReleaseRefused Event, a token no holder of this lock has.

--force is required: releasing a lease lets the next waiter in while the old
holder may still run; only a resource that checks fencing tokens keeps it out.`,
		Example: `  # Release the current holder's lease
  kubectl lockwarden release billing --force

  # Release one holder of a semaphore, by its fencing token
  kubectl lockwarden release exports --force --token 1796029117064694`,
		Args: exactArgs("LOCK", "the DistributedLock's name"),
		RunE: func(cmd *cobra.Command, args []string) error { return ro.run(cmd.Context(), args[0]) },
	}
	cmd.Flags().BoolVar(&ro.force, "force", false, "Confirm the force release. Required.")
	cmd.Flags().Int64Var(&ro.token, "token", 0, "The fencing token of the holder to release (default: status.fencingToken, the current holder's).")
	return cmd
}

func (ro *releaseOptions) run(ctx context.Context, name string) error {
	if !ro.force {
		return fmt.Errorf("release takes the lease away from the holder of lock %q while it may still run: add --force to confirm", name)
	}
	if ro.token < 0 {
		return fmt.Errorf("--token %d is not a fencing token: fencing tokens are positive", ro.token)
	}
	c, ns, err := ro.client()
	if err != nil {
		return err
	}
	dl, err := getLock(ctx, c, ns, name)
	if err != nil {
		return err
	}
	if pending, ok := dl.Annotations[locksv1alpha1.AnnotationForceRelease]; ok {
		return fmt.Errorf("lock %q in namespace %q already has a force release of fencing token %s pending (%s): wait for the operator to carry it out", name, ns, pending, locksv1alpha1.AnnotationForceRelease)
	}
	target, err := releaseTarget(dl, ro.token)
	if err != nil {
		return err
	}
	patch := map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		locksv1alpha1.AnnotationForceRelease: strconv.FormatInt(target.FencingToken, 10),
	}}}
	if err := patchLock(ctx, c, dl, patch); err != nil {
		return err
	}
	_, err = fmt.Fprintf(ro.Out, `distributedlock.locks.lockwarden.io/%s annotated %s=%d
Asked the operator to release the lease of %s (fencing token %d) on lock %s/%s.
The admission webhook records who asked in %s; the operator releases the lease, records the Event %s with who asked, and removes the request. The holder has then lost the lock (onLost: %s).
See the outcome with: kubectl describe dlock %s -n %s
`, name, locksv1alpha1.AnnotationForceRelease, target.FencingToken,
		printable.String(target.Identity), target.FencingToken, ns, name,
		locksv1alpha1.AnnotationForceReleaseBy, locksv1alpha1.EventForceReleased, dl.Spec.OnLost,
		name, ns)
	return err
}

// releaseTarget picks the holder to release: the one with token, or the
// only holder. It refuses what the operator would refuse.
func releaseTarget(dl *locksv1alpha1.DistributedLock, token int64) (locksv1alpha1.HolderStatus, error) {
	st := &dl.Status
	if dl.Spec.KeyFrom != nil {
		// A lease per derived key, and no holder list in status: the
		// operator looks for the token on every key in use.
		if token == 0 {
			return locksv1alpha1.HolderStatus{}, fmt.Errorf("lock %q derives a key per workload (spec.keyFrom) and has no single holder: name the one to release with --token (a Job's or Pod's %s annotation, or status.lanes.busiest[].fencingToken)",
				dl.Name, locksv1alpha1.AnnotationFencingToken)
		}
		return locksv1alpha1.HolderStatus{Identity: fmt.Sprintf("the holder with fencing token %d", token), FencingToken: token}, nil
	}
	holders := st.Holders
	if len(holders) == 0 && st.Holder != nil && st.Holder.Identity != "" {
		h := *st.Holder
		h.FencingToken = st.FencingToken
		holders = []locksv1alpha1.HolderStatus{h}
	}
	if len(holders) == 0 {
		return locksv1alpha1.HolderStatus{}, fmt.Errorf("lock %q in namespace %q has no holder (status.holder is empty): nothing to release", dl.Name, dl.Namespace)
	}
	list := make([]string, 0, len(holders))
	for _, h := range holders {
		list = append(list, fmt.Sprintf("%d (%s)", h.FencingToken, h.Identity))
	}
	var target *locksv1alpha1.HolderStatus
	switch {
	case token != 0:
		for i := range holders {
			if holders[i].FencingToken == token {
				target = &holders[i]
			}
		}
		if target == nil {
			return locksv1alpha1.HolderStatus{}, fmt.Errorf("no holder of lock %q has fencing token %d; its holders: %s", dl.Name, token, strings.Join(list, ", "))
		}
	case len(holders) > 1 || (st.HolderCount != nil && *st.HolderCount > 1):
		return locksv1alpha1.HolderStatus{}, fmt.Errorf("lock %q has several holders: name one with --token; its holders: %s", dl.Name, strings.Join(list, ", "))
	default:
		target = &holders[0]
	}
	if target.FencingToken <= 0 {
		return locksv1alpha1.HolderStatus{}, errors.New("the holder's fencing token is not in the lock's status yet: name it with --token")
	}
	if target.Lock != "" && (target.Lock != dl.Name || target.Namespace != dl.Namespace) {
		return locksv1alpha1.HolderStatus{}, fmt.Errorf("%s acquired through lock %s/%s, not %s/%s: the operator releases only holders that acquired through the lock; release it there",
			target.Identity, target.Namespace, target.Lock, dl.Namespace, dl.Name)
	}
	return *target, nil
}
