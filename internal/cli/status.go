package cli

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/printable"
)

type statusOptions struct {
	*options
	allNamespaces bool
	key           string
	print         *genericclioptions.PrintFlags
}

func newStatusCommand(o *options) *cobra.Command {
	so := &statusOptions{options: o, print: genericclioptions.NewPrintFlags("").WithTypeSetter(scheme)}
	cmd := &cobra.Command{
		Use:   "status [LOCK... | LOCK --key KEY]",
		Short: "List locks with their holder, fencing token, queue and backend health",
		Long: `status lists the DistributedLocks of the namespace (or of every namespace with -A),
or the named ones, as the operator last observed them in their backend:

  KEYS      the lock's keys
  HOLDER    who holds the keys (of a semaphore, the oldest holder; "+N" more):
            cluster/namespace/Kind/name/uid-prefix for a Job, a Pod, or a
            Deployment or StatefulSet holding for its Pods (holder mode
            Workload); a manual holder's identity
  FENCE     the holder's fencing token
  QUEUE     how many wait (status.queueLength, exact)
  BACKEND   where the lock lives: redis (inline endpoints), LockBackend/NAME or ClusterLockBackend/NAME
  READY     the BackendReady condition's reason (Reachable while the backend answers)

-o wide adds HELD (the Held condition's reason), SLOTS, the MANUAL-HOLDER
(spec.holder) with its ManualHolderHeld reason, and EXPIRES.
-o json|yaml prints the DistributedLocks themselves, as kubectl get does.

A lock with spec.keyFrom derives a key (a lane) for each Job or Pod and
shows counts in status.lanes, not one holder. --key K shows one lane of one
lock: the Jobs and Pods of the namespace whose lockwarden.io/key is K that
hold it (their holder identity, fencing token and for how long) and how many
wait, with the lane's counts from status.lanes.busiest when it is among the
busiest keys (those count every cluster sharing the store).`,
		Example: `  # The locks of the current namespace
  kubectl lockwarden status

  # Every namespace, with the Held reason, slots and manual holder
  kubectl lockwarden status -A -o wide

  # One lock as YAML
  kubectl lockwarden status billing -n team-a -o yaml

  # One lane of a lock with spec.keyFrom: who holds it, how many wait
  kubectl lockwarden status deploys --key deploy/prod`,
		RunE: func(cmd *cobra.Command, args []string) error { return so.run(cmd, args) },
	}
	cmd.Flags().BoolVarP(&so.allNamespaces, "all-namespaces", "A", false, "List the locks of every namespace (-n is ignored).")
	cmd.Flags().StringVar(&so.key, "key", "", "For one lock with spec.keyFrom: show the lane of this derived key (a Job's or Pod's lockwarden.io/key annotation, for example deploy/prod).")
	so.print.AddFlags(cmd)
	cmd.Flag("output").Usage = fmt.Sprintf("Output format. One of: (wide, %s).", strings.Join(so.print.AllowedFormats(), ", "))
	return cmd
}

func (so *statusOptions) run(cmd *cobra.Command, names []string) error {
	format := *so.print.OutputFormat
	var printer printers.ResourcePrinter
	if format != "" && format != "wide" {
		p, err := so.print.ToPrinter()
		if err != nil {
			return fmt.Errorf("--output %q is not a format of status: use wide, %s", format, strings.Join(so.print.AllowedFormats(), ", "))
		}
		printer = p
	}
	if given, err := keyGiven(cmd, so.key); given || err != nil {
		if err != nil {
			return err
		}
		return so.runKey(cmd, names, format)
	}
	if so.allNamespaces && len(names) > 0 {
		return fmt.Errorf("name the locks (%s) in one namespace with -n, or list every namespace with -A and no names", strings.Join(names, ", "))
	}
	c, ns, err := so.client()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	var list locksv1alpha1.DistributedLockList
	switch {
	case len(names) > 0:
		for _, name := range names {
			dl, err := getLock(ctx, c, ns, name)
			if err != nil {
				return err
			}
			list.Items = append(list.Items, *dl)
		}
	case so.allNamespaces:
		err = c.List(ctx, &list)
	default:
		err = c.List(ctx, &list, client.InNamespace(ns))
	}
	if err != nil {
		return fmt.Errorf("list DistributedLocks: %w", err)
	}
	slices.SortFunc(list.Items, func(a, b locksv1alpha1.DistributedLock) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})

	if printer != nil {
		gvk := locksv1alpha1.GroupVersion.WithKind("DistributedLock")
		for i := range list.Items {
			list.Items[i].SetGroupVersionKind(gvk)
		}
		if len(names) == 1 {
			return printer.PrintObj(&list.Items[0], so.Out)
		}
		return printer.PrintObj(&list, so.Out)
	}
	if len(list.Items) == 0 {
		if so.allNamespaces {
			_, err = fmt.Fprintln(so.ErrOut, "No DistributedLocks found in any namespace.")
		} else {
			_, err = fmt.Fprintf(so.ErrOut, "No DistributedLocks found in namespace %s.\n", ns)
		}
		return err
	}
	return printStatusTable(so.Out, list.Items, so.allNamespaces, format == "wide", time.Now())
}

// runKey shows one lane of one lock: --key names a derived key of a
// single lock, so it takes exactly one name and no -A.
func (so *statusOptions) runKey(cmd *cobra.Command, names []string, format string) error {
	switch {
	case so.allNamespaces:
		return fmt.Errorf("--key %q shows a lane of one lock: name the lock in one namespace with -n, not -A", so.key)
	case len(names) == 0:
		return fmt.Errorf("--key %q needs the lock whose lane it is: kubectl lockwarden status LOCK --key %s", so.key, so.key)
	case len(names) > 1:
		return fmt.Errorf("--key %q shows a lane of one lock, got %d: %s", so.key, len(names), strings.Join(names, " "))
	case format != "":
		return fmt.Errorf("--key %q prints one lane as text: drop -o %s, or drop --key to print the lock as %s", so.key, format, format)
	}
	c, ns, err := so.client()
	if err != nil {
		return err
	}
	v, err := readLane(cmd.Context(), c, ns, names[0], so.key)
	if err != nil {
		return err
	}
	return v.printStatus(so.Out, time.Now())
}

// printStatus writes one lane: the lock, the lane's counts in status.lanes,
// its holders in this namespace with their fencing tokens, and how many
// wait.
func (v *laneView) printStatus(out io.Writer, now time.Time) error {
	dl := v.lock
	lines := []string{fmt.Sprintf("Lock %s/%s (keys %s): %s.", dl.Namespace, dl.Name, lockKeys(dl), heldBy(&dl.Status, now))}
	if v.idle() {
		return writeLines(out, append(lines, v.nothingHere()))
	}
	if v.busiest != nil {
		lines = append(lines, fmt.Sprintf("Key %s is among the busiest keys of status.lanes: %s (in every cluster sharing the store).", v.key, laneCounts(v.busiest)))
	} else {
		lines = append(lines, fmt.Sprintf("Key %s is not among the busiest keys of status.lanes, which has no counts for it; below are the Jobs and Pods of this namespace.", v.key))
	}
	switch {
	case len(v.holders) == 0 && v.busiest != nil && v.busiest.Holders > 0:
		lines = append(lines, fmt.Sprintf("No Job or Pod of this namespace holds it: status.lanes counts %d holder(s), %s.", v.busiest.Holders, v.heldElsewhere()))
	case len(v.holders) == 0:
		lines = append(lines, "No Job or Pod of this namespace holds it.")
	default:
		lines = append(lines, fmt.Sprintf("Held in this namespace by %d holder(s):", len(v.holders)))
	}
	if err := writeLines(out, lines); err != nil {
		return err
	}
	if len(v.holders) > 0 {
		fmt.Fprintln(out)
		w := printers.GetNewTabWriter(out)
		fmt.Fprintln(w, "HOLDER\tFENCE\tHOLDING\tJOBS/PODS")
		for _, h := range v.holders {
			held := "<unknown>"
			if !h.since.IsZero() {
				held = humanSince(now, h.since)
			}
			identity := h.identity
			if identity == "" {
				identity = "<none>"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", printable.String(identity), printable.String(h.fence), held, printable.String(strings.Join(h.objects, ",")))
		}
		if err := w.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(out)
	}
	if len(v.waiters) == 0 {
		return writeLines(out, []string{"Nothing of this namespace waits for it."})
	}
	first := v.waiters[0]
	return writeLines(out, []string{
		fmt.Sprintf("%d Job(s) or Pod(s) of this namespace wait for it; the first, %s%s, has waited %s.", len(v.waiters), first.object, first.place(), humanSince(now, first.since)),
		fmt.Sprintf("kubectl lockwarden why %s --key %s says why they wait.", dl.Name, v.key),
	})
}

// printStatusTable writes the locks as kubectl get does: aligned columns,
// NAMESPACE first with -A, <none> for empty cells.
func printStatusTable(out io.Writer, locks []locksv1alpha1.DistributedLock, withNamespace, wide bool, now time.Time) error {
	w := printers.GetNewTabWriter(out)
	header := []string{"NAME", "KEYS", "HOLDER", "FENCE", "QUEUE", "BACKEND", "READY", "AGE"}
	if wide {
		header = append(header, "HELD", "SLOTS", "MANUAL-HOLDER", "EXPIRES")
	}
	if withNamespace {
		header = append([]string{"NAMESPACE"}, header...)
	}
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for i := range locks {
		dl := &locks[i]
		st := &dl.Status
		row := []string{
			dl.Name,
			lockKeys(dl),
			holderCell(st),
			fenceCell(st.FencingToken),
			strconv.Itoa(int(queueLength(st))),
			backendName(dl.Spec.Backend),
			conditionReason(st.Conditions, locksv1alpha1.ConditionBackendReady),
			duration.HumanDuration(now.Sub(dl.CreationTimestamp.Time)),
		}
		if wide {
			slots := st.Slots
			if slots == "" {
				slots = "<none>"
			}
			manual := "<none>"
			if h := dl.Spec.Holder; h != nil {
				manual = fmt.Sprintf("%s (%s)", h.Identity, conditionReason(st.Conditions, locksv1alpha1.ConditionManualHolderHeld))
			}
			expires := "<none>"
			if st.ExpireTime != nil {
				expires = st.ExpireTime.UTC().Format(time.RFC3339)
			}
			row = append(row, conditionReason(st.Conditions, locksv1alpha1.ConditionHeld), slots, manual, expires)
		}
		if withNamespace {
			row = append([]string{dl.Namespace}, row...)
		}
		// Status comes from the backend (whoever can write it chooses the
		// holder's identity) and may have been written by an older operator
		// that did not escape it: no cell may add a row, a column or a
		// terminal control sequence.
		for i := range row {
			row[i] = printable.String(row[i])
		}
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
	return w.Flush()
}

// holderCell is the holder's identity, with "+N" for the other holders of a semaphore.
func holderCell(st *locksv1alpha1.DistributedLockStatus) string {
	if st.Holder == nil || st.Holder.Identity == "" {
		return "<none>"
	}
	if st.HolderCount != nil && *st.HolderCount > 1 {
		return fmt.Sprintf("%s +%d", st.Holder.Identity, *st.HolderCount-1)
	}
	return st.Holder.Identity
}

func fenceCell(token int64) string {
	if token == 0 {
		return "<none>"
	}
	return strconv.FormatInt(token, 10)
}

// queueLength is status.queueLength, or the length of status.waiting when
// the operator has not reported the exact count.
func queueLength(st *locksv1alpha1.DistributedLockStatus) int32 {
	if st.QueueLength != nil {
		return *st.QueueLength
	}
	return int32(len(st.Waiting)) //nolint:gosec // G115: at most 10 entries
}

// backendName says where a lock lives.
func backendName(b locksv1alpha1.Backend) string {
	switch {
	case b.ClusterBackendRef != nil:
		return "ClusterLockBackend/" + b.ClusterBackendRef.Name
	case b.BackendRef != nil:
		return "LockBackend/" + b.BackendRef.Name
	case b.Redis != nil && b.Redis.Sentinel != nil:
		return "redis-sentinel/" + b.Redis.Sentinel.MasterName
	case b.Redis != nil && len(b.Redis.Endpoints) > 1:
		return fmt.Sprintf("redlock (%d masters)", len(b.Redis.Endpoints))
	case b.Redis != nil && len(b.Redis.Endpoints) == 1:
		return "redis/" + b.Redis.Endpoints[0]
	}
	return "<none>"
}

// conditionReason is the reason of the condition of type t, "Unknown" when
// the operator has not set it yet.
func conditionReason(conds []metav1.Condition, t string) string {
	c := meta.FindStatusCondition(conds, t)
	if c == nil || c.Reason == "" {
		return "Unknown"
	}
	return c.Reason
}

// ago says how long ago t was, as kubectl's AGE column does.
func ago(now time.Time, t *metav1.Time) string {
	if t == nil || t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}
