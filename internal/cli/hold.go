package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/printable"
)

// pollInterval is how often --wait reads the lock.
const pollInterval = 250 * time.Millisecond

type holdOptions struct {
	*options
	as      string
	until   string
	maxHold time.Duration
	wait    bool
	timeout time.Duration
}

func newHoldCommand(o *options) *cobra.Command {
	ho := &holdOptions{options: o}
	cmd := &cobra.Command{
		Use:   "hold LOCK --as NAME [--wait] [--timeout D]",
		Short: "Make the operator hold a lock for a manual holder (spec.holder)",
		Long: `hold sets the lock's manual holder, spec.holder, to NAME: the operator acquires
the lock for NAME in its turn (behind the current holder and the waiters ahead)
and holds it until "unhold", the lock's deletion, or --until / --max-hold end it.

The change is a JSON merge patch of spec.holder only (field manager
kubectl-lockwarden), made only if the lock did not change since it was read.
A lock that already has another manual holder is refused: unhold it first.

With --wait, hold returns once the condition ManualHolderHeld is True for this
change, printing the condition's reason while it waits (Waiting: queued behind
a holder), and fails with that reason when --timeout passes first.`,
		Example: `  # Start a maintenance window and wait until it holds the lock
  kubectl lockwarden hold billing --as maintenance-2026-12-01 --wait --timeout 2h

  # Hold for at most one hour from when it acquires
  kubectl lockwarden hold billing --as db-migration --max-hold 1h`,
		Args: exactArgs("LOCK", "the DistributedLock's name"),
		RunE: func(cmd *cobra.Command, args []string) error { return ho.run(cmd.Context(), args[0]) },
	}
	cmd.Flags().StringVar(&ho.as, "as", "", "The manual holder's identity (spec.holder.identity), 1 to 128 printable characters, for example maintenance-2026-12-01. Required.")
	cmd.Flags().StringVar(&ho.until, "until", "", "End the hold at this time (RFC 3339, for example 2026-12-01T06:00:00Z): spec.holder.until.")
	cmd.Flags().DurationVar(&ho.maxHold, "max-hold", 0, "End the hold this long after it acquired the lock, in whole seconds (for example 1h): spec.holder.maxHoldSeconds.")
	cmd.Flags().BoolVar(&ho.wait, "wait", false, "Wait until the manual holder holds the lock (condition ManualHolderHeld True).")
	cmd.Flags().DurationVar(&ho.timeout, "timeout", 5*time.Minute, "How long --wait waits, for example 30s or 2h.")
	return cmd
}

// validate checks the flags and returns spec.holder as it will be patched.
func (ho *holdOptions) validate() (map[string]any, error) {
	if ho.as == "" {
		return nil, errors.New("--as is required: the manual holder's identity, for example --as maintenance-2026-12-01")
	}
	if len(ho.as) > 128 {
		return nil, fmt.Errorf("--as %q is %d characters long: at most 128", ho.as, len(ho.as))
	}
	holder := map[string]any{"identity": ho.as, "until": nil, "maxHoldSeconds": nil}
	if ho.until != "" {
		t, err := time.Parse(time.RFC3339, ho.until)
		if err != nil {
			return nil, fmt.Errorf("--until %q is not an RFC 3339 time such as 2026-12-01T06:00:00Z", ho.until)
		}
		holder["until"] = t.UTC().Format(time.RFC3339)
	}
	if ho.maxHold != 0 {
		if ho.maxHold < time.Second || ho.maxHold > 2678400*time.Second || ho.maxHold%time.Second != 0 {
			return nil, fmt.Errorf("--max-hold %s must be whole seconds from 1s to 744h (31 days)", ho.maxHold)
		}
		holder["maxHoldSeconds"] = int64(ho.maxHold / time.Second)
	}
	if ho.wait && ho.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %s must be positive, for example --timeout 10m", ho.timeout)
	}
	return holder, nil
}

func (ho *holdOptions) run(ctx context.Context, name string) error {
	holder, err := ho.validate()
	if err != nil {
		return err
	}
	c, ns, err := ho.client()
	if err != nil {
		return err
	}
	dl, err := getLock(ctx, c, ns, name)
	if err != nil {
		return err
	}
	if h := dl.Spec.Holder; h != nil && h.Identity != ho.as {
		return fmt.Errorf("lock %q in namespace %q already has the manual holder %q (spec.holder.identity): unhold it first, or hold --as %q", name, ns, h.Identity, h.Identity)
	}
	if err := patchLock(ctx, c, dl, map[string]any{"spec": map[string]any{"holder": holder}}); err != nil {
		return err
	}
	fmt.Fprintf(ho.Out, "distributedlock.locks.lockwarden.io/%s: manual holder %q set (spec.holder); the operator acquires the lock for it in its turn.\n", name, ho.as)
	if !ho.wait {
		return nil
	}
	return waitFor(ctx, c, dl, ho.timeout, ho.Out, true,
		fmt.Sprintf("manual holder %q to hold lock %q in namespace %q", ho.as, name, ns))
}

type unholdOptions struct {
	*options
	wait    bool
	timeout time.Duration
}

func newUnholdCommand(o *options) *cobra.Command {
	uo := &unholdOptions{options: o}
	cmd := &cobra.Command{
		Use:   "unhold LOCK [--wait] [--timeout D]",
		Short: "Remove a lock's manual holder (spec.holder); the operator releases its lease",
		Long: `unhold removes the lock's manual holder, spec.holder (a JSON merge patch of that
field only, field manager kubectl-lockwarden). The operator then releases the
manual holder's lease, or takes it out of the queue, and the next waiter runs.

With --wait, unhold returns once the operator has observed the change and
ManualHolderHeld is no longer True (reason NoManualHolder).`,
		Example: `  kubectl lockwarden unhold billing
  kubectl lockwarden unhold billing -n team-a --wait --timeout 1m`,
		Args: exactArgs("LOCK", "the DistributedLock's name"),
		RunE: func(cmd *cobra.Command, args []string) error { return uo.run(cmd.Context(), args[0]) },
	}
	cmd.Flags().BoolVar(&uo.wait, "wait", false, "Wait until the operator has released the manual holder (ManualHolderHeld no longer True).")
	cmd.Flags().DurationVar(&uo.timeout, "timeout", 5*time.Minute, "How long --wait waits, for example 30s or 2h.")
	return cmd
}

func (uo *unholdOptions) run(ctx context.Context, name string) error {
	if uo.wait && uo.timeout <= 0 {
		return fmt.Errorf("--timeout %s must be positive, for example --timeout 1m", uo.timeout)
	}
	c, ns, err := uo.client()
	if err != nil {
		return err
	}
	dl, err := getLock(ctx, c, ns, name)
	if err != nil {
		return err
	}
	if dl.Spec.Holder == nil {
		_, err := fmt.Fprintf(uo.Out, "Lock %s/%s has no manual holder (spec.holder is not set): nothing to remove.\n", ns, name)
		return err
	}
	identity := dl.Spec.Holder.Identity
	if err := patchLock(ctx, c, dl, map[string]any{"spec": map[string]any{"holder": nil}}); err != nil {
		return err
	}
	fmt.Fprintf(uo.Out, "distributedlock.locks.lockwarden.io/%s: manual holder %q removed; the operator releases its lease.\n", name, identity)
	if !uo.wait {
		return nil
	}
	return waitFor(ctx, c, dl, uo.timeout, uo.Out, false,
		fmt.Sprintf("the operator to release manual holder %q of lock %q in namespace %q", identity, name, ns))
}

// patchLock applies a JSON merge patch to dl, made only if dl has not
// changed since it was read (its resourceVersion), and updates dl with the
// result.
func patchLock(ctx context.Context, c client.Client, dl *locksv1alpha1.DistributedLock, patch map[string]any) error {
	md, _ := patch["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
		patch["metadata"] = md
	}
	md["resourceVersion"] = dl.ResourceVersion
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, dl, client.RawPatch(types.MergePatchType, data), client.FieldOwner(FieldManager)); err != nil {
		return fmt.Errorf("update lock %q in namespace %q: %w", dl.Name, dl.Namespace, err)
	}
	return nil
}

// waitFor polls the lock until ManualHolderHeld, as observed for dl's
// generation (after the patch) or a later one, is True (held) or not True
// (!held), or timeout passes. It prints the condition whenever its reason
// changes.
func waitFor(ctx context.Context, c client.Client, dl *locksv1alpha1.DistributedLock, timeout time.Duration, out io.Writer, held bool, what string) error {
	generation := dl.Generation
	key := client.ObjectKeyFromObject(dl)
	var last *metav1.Condition
	lastShown := ""
	err := wait.PollUntilContextTimeout(ctx, pollInterval, timeout, true, func(context.Context) (bool, error) {
		// Each read runs to its end even when the timeout falls during it,
		// so that a timeout is reported as one, with the last condition.
		var cur locksv1alpha1.DistributedLock
		if err := c.Get(ctx, key, &cur); err != nil {
			return false, fmt.Errorf("read lock %q in namespace %q: %w", key.Name, key.Namespace, err)
		}
		cond := meta.FindStatusCondition(cur.Status.Conditions, locksv1alpha1.ConditionManualHolderHeld)
		if cond == nil || cond.ObservedGeneration < generation {
			return false, nil
		}
		last = cond
		if shown := string(cond.Status) + "/" + cond.Reason; shown != lastShown {
			lastShown = shown
			fmt.Fprintf(out, "%s=%s (%s): %s\n", locksv1alpha1.ConditionManualHolderHeld, cond.Status, cond.Reason, printable.String(cond.Message))
		}
		return (cond.Status == metav1.ConditionTrue) == held, nil
	})
	switch {
	case err == nil:
		return nil
	case !wait.Interrupted(err):
		return err
	case last == nil:
		return fmt.Errorf("timed out after %s waiting for %s: the operator has not reported %s for generation %d of the lock yet (is it running?)",
			timeout, what, locksv1alpha1.ConditionManualHolderHeld, generation)
	default:
		return fmt.Errorf("timed out after %s waiting for %s: %s is %s, reason %s: %s",
			timeout, what, locksv1alpha1.ConditionManualHolderHeld, last.Status, last.Reason, last.Message)
	}
}
