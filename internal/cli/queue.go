package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/printable"
)

func newQueueCommand(o *options) *cobra.Command {
	var key string
	cmd := &cobra.Command{
		Use:   "queue LOCK [--key KEY]",
		Short: "Show who waits for a lock, in order, and for how long",
		Long: `queue shows the FIFO queue of a lock: each waiter's position (1 is next), who
it is, the Job when the waiter is a Job of this namespace, and how long it has
waited. The queue belongs to the lock's keys, so it also holds waiters of other
locks (scope Global) and other clusters that share them.

The data comes from two places, and the SOURCE column says which:

  status     the lock's status.waiting: the first 10 waiters, oldest first,
             with the time each joined, as the operator last observed them in
             the backend (status.queueLength is the exact count)
  job        the lockwarden.io/queue-position annotation ("3/7") that the
             operator keeps on each waiting Job of the lock in this namespace;
             it shows waiters past the first 10. Their waiting time counts
             from the Job's creation (a Job joins the queue moments later).

A lock with spec.keyFrom has a queue per derived key and no status.waiting.
--key K shows the queue of one key: the waiting Jobs of this namespace whose
lockwarden.io/key is K, by their place in that key's queue, after the key's
counts from status.lanes.busiest. why LOCK --key K also names the key's
waiting Pods and whom they wait behind.`,
		Example: `  kubectl lockwarden queue billing
  kubectl lockwarden queue billing -n team-a
  kubectl lockwarden queue deploys --key deploy/prod`,
		Args: exactArgs("LOCK", "the DistributedLock's name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := keyGiven(cmd, key); err != nil {
				return err
			}
			c, ns, err := o.client()
			if err != nil {
				return err
			}
			q, err := readQueue(cmd.Context(), c, ns, args[0], key)
			if err != nil {
				return err
			}
			return q.print(o.Out, time.Now())
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "For a lock with spec.keyFrom: show the queue of this derived key only (a Job's lockwarden.io/key annotation, for example deploy/prod).")
	return cmd
}

// exactArgs accepts exactly one argument and names it when it is missing.
func exactArgs(name, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) == 0:
			return fmt.Errorf("%s is required: %s (usage: %s)", name, what, cmd.UseLine())
		case len(args) > 1:
			return fmt.Errorf("one %s only, got %d: %s", name, len(args), strings.Join(args, " "))
		}
		return nil
	}
}

// waiter is one row of the queue.
type waiter struct {
	position int
	identity string
	job      string
	since    time.Time
	source   string
}

// queueView is what queue shows for one lock.
type queueView struct {
	lock *locksv1alpha1.DistributedLock
	// key is the derived key asked for with --key ("" for all).
	key     string
	length  int32
	waiters []waiter
}

// readQueue reads the lock's status.waiting and the queue-position
// annotations of its waiting Jobs in the namespace.
func readQueue(ctx context.Context, c client.Client, ns, name, key string) (*queueView, error) {
	dl, err := laneLock(ctx, c, ns, name, key)
	if err != nil {
		return nil, err
	}
	var jobs batchv1.JobList
	if err := c.List(ctx, &jobs, client.InNamespace(ns), client.MatchingLabels{locksv1alpha1.LabelLock: name}); err != nil {
		return nil, fmt.Errorf("list the Jobs of lock %q in namespace %q: %w", name, ns, err)
	}
	q := &queueView{lock: dl, key: key, length: queueLength(&dl.Status)}
	byName := map[string]bool{}
	for i, w := range dl.Status.Waiting {
		row := waiter{position: i + 1, identity: w.Identity, source: "status"}
		if w.Since != nil {
			row.since = w.Since.Time
		}
		if wns, kind, wname, ok := workload(w.Identity); ok && kind == "Job" && wns == ns {
			row.job = wname
			byName[wname] = true
		}
		q.waiters = append(q.waiters, row)
	}
	for i := range jobs.Items {
		job := &jobs.Items[i]
		if key != "" && job.Annotations[locksv1alpha1.AnnotationKey] != key {
			continue
		}
		pos, length, ok := parsePosition(job.Annotations[locksv1alpha1.AnnotationQueuePosition])
		if !ok || byName[job.Name] || pos <= len(dl.Status.Waiting) {
			continue
		}
		q.waiters = append(q.waiters, waiter{position: pos, identity: "Job/" + job.Name, job: job.Name, since: job.CreationTimestamp.Time, source: "job"})
		q.length = max(q.length, int32(length)) //nolint:gosec // G115: a queue position, far below 2^31
	}
	slices.SortStableFunc(q.waiters, func(a, b waiter) int { return a.position - b.position })
	return q, nil
}

func (q *queueView) print(out io.Writer, now time.Time) error {
	dl := q.lock
	fmt.Fprintf(out, "Lock %s/%s (keys %s): %s.\n", dl.Namespace, dl.Name, lockKeys(dl), printable.String(heldBy(&dl.Status, now)))
	if q.key != "" {
		fmt.Fprintf(out, "Key %s: %s.\n", printable.String(q.key), laneSummary(&dl.Status, q.key))
	}
	if len(q.waiters) == 0 {
		if q.key != "" {
			// A lock with keyFrom has no status.waiting or status.queueLength.
			_, err := fmt.Fprintf(out, "No Job of this namespace waits for key %s; kubectl lockwarden why %s --key %s also names waiting Pods.\n",
				printable.String(q.key), dl.Name, printable.String(q.key))
			return err
		}
		if dl.Status.ObservedGeneration == 0 && len(dl.Status.Conditions) == 0 {
			_, err := fmt.Fprintln(out, "The operator has not reported this lock's status yet: is it running?")
			return err
		}
		_, err := fmt.Fprintln(out, "Nobody waits (status.queueLength is 0).")
		return err
	}
	shown := fmt.Sprintf("%d waiting", q.length)
	switch {
	case int(q.length) <= len(q.waiters):
	case q.key != "":
		shown += fmt.Sprintf(", %d shown: only this namespace's Jobs carry their place in the key's queue (kubectl lockwarden why %s --key %s also names waiting Pods)",
			len(q.waiters), dl.Name, printable.String(q.key))
	default:
		shown += fmt.Sprintf(", %d shown: status.waiting lists the first 10 and only this namespace's Jobs carry their position", len(q.waiters))
	}
	fmt.Fprintf(out, "%s:\n\n", capitalize(shown))
	w := printers.GetNewTabWriter(out)
	fmt.Fprintln(w, "POSITION\tWAITER\tJOB\tWAITING\tSOURCE")
	for _, r := range q.waiters {
		job := r.job
		if job == "" {
			job = "<none>"
		}
		waiting := "<unknown>"
		if !r.since.IsZero() {
			waiting = humanSince(now, r.since)
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", r.position, printable.String(r.identity), printable.String(job), waiting, r.source)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if q.key != "" {
		_, err := fmt.Fprintf(out, "\nSOURCE job: the Job's %s annotation, its place in the queue of key %s.\n", locksv1alpha1.AnnotationQueuePosition, printable.String(q.key))
		return err
	}
	_, err := fmt.Fprintf(out, "\nSOURCE status: the lock's status.waiting, as the operator last observed the backend; job: the Job's %s annotation.\n", locksv1alpha1.AnnotationQueuePosition)
	return err
}

// lockKeys shows a lock's keys: the fixed ones, or how it derives them.
func lockKeys(dl *locksv1alpha1.DistributedLock) string {
	if dl.Spec.KeyFrom != nil {
		return "derived: " + dl.Spec.KeyFrom.Expression
	}
	return strings.Join(dl.Spec.Keys, ",")
}

// heldBy says who holds a lock and with which fencing token.
func heldBy(st *locksv1alpha1.DistributedLockStatus, now time.Time) string {
	if l := st.Lanes; l != nil {
		s := fmt.Sprintf("using %d derived key(s), with %d holder(s) and %d waiting", l.Keys, l.Holders, l.Waiting)
		for i, b := range l.Busiest {
			if i == 0 {
				s += "; busiest:"
			}
			s += fmt.Sprintf(" %s (%d holding, %d waiting)", b.Key, b.Holders, b.Waiting)
		}
		return s
	}
	if st.Holder == nil || st.Holder.Identity == "" {
		return "nobody holds it"
	}
	s := fmt.Sprintf("held by %s with fencing token %d", st.Holder.Identity, st.FencingToken)
	if st.AcquiredTime != nil {
		s += fmt.Sprintf(" for %s", ago(now, st.AcquiredTime))
	}
	if st.HolderCount != nil && *st.HolderCount > 1 {
		s += fmt.Sprintf(" and by %d other holder(s) (slots %s)", *st.HolderCount-1, st.Slots)
	}
	return s
}

// workload splits a workload holder's identity,
// cluster/namespace/Kind/name/uid-prefix, into its parts.
func workload(identity string) (namespace, kind, name string, ok bool) {
	parts := strings.Split(identity, "/")
	n := len(parts)
	if n < 5 {
		return "", "", "", false
	}
	return parts[n-4], parts[n-3], parts[n-2], true
}

// parsePosition reads a queue-position annotation, "position/length".
func parsePosition(s string) (position, length int, ok bool) {
	p, l, found := strings.Cut(s, "/")
	if !found {
		return 0, 0, false
	}
	position, err1 := strconv.Atoi(p)
	length, err2 := strconv.Atoi(l)
	if err1 != nil || err2 != nil || position < 1 {
		return 0, 0, false
	}
	return position, length, true
}

func humanSince(now, t time.Time) string {
	return duration.HumanDuration(now.Sub(t))
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// laneSummary says what the lock's status shows of one derived key: its
// holders and waiters when it is among the busiest, else that it has none:
// then the Jobs' queue positions are all there is.
func laneSummary(st *locksv1alpha1.DistributedLockStatus, key string) string {
	if l := busiestLane(st, key); l != nil {
		return laneCounts(l)
	}
	return "not among the busiest keys of status.lanes, which has no counts for it"
}
