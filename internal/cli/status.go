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
	print         *genericclioptions.PrintFlags
}

func newStatusCommand(o *options) *cobra.Command {
	so := &statusOptions{options: o, print: genericclioptions.NewPrintFlags("").WithTypeSetter(scheme)}
	cmd := &cobra.Command{
		Use:   "status [LOCK...]",
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
-o json|yaml prints the DistributedLocks themselves, as kubectl get does.`,
		Example: `  # The locks of the current namespace
  kubectl lockwarden status

  # Every namespace, with the Held reason, slots and manual holder
  kubectl lockwarden status -A -o wide

  # One lock as YAML
  kubectl lockwarden status billing -n team-a -o yaml`,
		RunE: func(cmd *cobra.Command, args []string) error { return so.run(cmd, args) },
	}
	cmd.Flags().BoolVarP(&so.allNamespaces, "all-namespaces", "A", false, "List the locks of every namespace (-n is ignored).")
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
