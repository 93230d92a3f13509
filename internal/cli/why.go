package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/printable"
)

func newWhyCommand(o *options) *cobra.Command {
	var key string
	cmd := &cobra.Command{
		Use:   "why (JOB | job/NAME | pod/NAME | LOCK --key KEY)",
		Short: "Explain why a Job is suspended or a Pod is gated, or why a lane of a lock (--key) waits",
		Long: `why explains in words what lockwarden does with a Job or a Pod: which lock
gates it, its position in the lock's queue and whom it waits behind, who holds
the lock with which fencing token; or that it holds the lock, did not run
because the lock was held (contention Skip), waited too long, was superseded,
lost its lease, or is not gated by lockwarden at all.

For a Pod (of a Deployment, StatefulSet or ReplicaSet, or a bare Pod) it also
says who holds the lock for it (the Pod itself, or its workload in holder mode
Workload), whether it is still held back by its scheduling gate, and, for a
Pod being deleted, when it releases the lock. A lock whose Deployment rollout
waits on its own old Pods (condition RolloutBlocked) says so.

A bare NAME is looked up as a Job first, then as a Pod; job/NAME and pod/NAME
name one kind. It reads the object's lockwarden.io/* annotations and
conditions, and the lock's status, as the operator last wrote them.

For a lock with spec.keyFrom, LOCK --key K (or lock/LOCK --key K) explains
one lane, the derived key K that the lock's Jobs and Pods carry in
lockwarden.io/key: which of them in this namespace wait for it and in which
order, whom the first waits behind, who holds it with which fencing token and
for how long, how long the lane's queue is (status.lanes.busiest), and what
else keeps them waiting: spec.cooldownSeconds after each release, or a
backend that does not answer. --key takes no job/NAME or pod/NAME, and no
lock with fixed keys (spec.keys).`,
		Example: `  kubectl lockwarden why nightly-report-29120
  kubectl lockwarden why job/nightly-report-29120 -n team-a
  kubectl lockwarden why pod/payments-singleton-7d9f8b6c5d-x2k9q -n team-a
  kubectl lockwarden why deploys --key deploy/prod -n team-a`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && key != "" {
				return fmt.Errorf("--key %q needs the lock whose lane it is: kubectl lockwarden why LOCK --key %s", key, key)
			}
			return exactArgs("JOB", "the name of a Job, or job/NAME or pod/NAME, or a lock with --key")(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			// Checked before connecting: a misnamed lane needs no API server to refuse.
			given, err := keyGiven(cmd, key)
			if err != nil {
				return err
			}
			lock := ""
			if given {
				if lock, err = laneArg(args[0], key); err != nil {
					return err
				}
			}
			c, ns, err := o.client()
			if err != nil {
				return err
			}
			if lock != "" {
				return whyLane(cmd.Context(), c, ns, lock, key, o.Out, time.Now())
			}
			return why(cmd.Context(), c, ns, args[0], o.Out, time.Now())
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "For a lock with spec.keyFrom: explain why the Jobs and Pods of this derived key wait (a Job's or Pod's lockwarden.io/key annotation, for example deploy/prod); name the lock as LOCK or lock/LOCK.")
	return cmd
}

// why writes the explanation for the Job or Pod arg names: job/NAME,
// pod/NAME, or a bare NAME, a Job if there is one, else a Pod.
func why(ctx context.Context, c client.Client, ns, arg string, out io.Writer, now time.Time) error {
	kind, name, typed := strings.Cut(arg, "/")
	if !typed {
		kind, name = "", arg
	}
	if name == "" {
		kind = "?"
	}
	switch kindOf(kind) {
	case kindJob:
		return whyNamedJob(ctx, c, ns, name, out, now)
	case kindPod:
		return whyNamedPod(ctx, c, ns, name, out, now)
	case kindLock:
		return fmt.Errorf("why %s explains a lane of a lock with spec.keyFrom: add --key KEY; without it, why explains a Job or a Pod (JOB, job/NAME or pod/NAME)", arg)
	case kindNone:
		var job batchv1.Job
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &job)
		switch {
		case err == nil:
			return whyJob(ctx, c, &job, out, now)
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("get job %q in namespace %q: %w", name, ns, err)
		}
		var pod corev1.Pod
		err = c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pod)
		switch {
		case err == nil:
			return whyPod(ctx, c, &pod, out, now)
		case apierrors.IsNotFound(err):
			return fmt.Errorf("job %q not found in namespace %q, nor a pod of that name%s", name, ns, lockHint(ctx, c, ns, name))
		}
		return fmt.Errorf("get pod %q in namespace %q: %w", name, ns, err)
	}
	return fmt.Errorf("why explains a Job or a Pod: name it as JOB, job/NAME or pod/NAME, not %q", arg)
}

// The kinds why tells apart in TYPE/NAME.
const (
	kindNone = iota // a bare NAME
	kindJob
	kindPod
	kindLock
	kindOther
)

// kindOf is the kind a TYPE of TYPE/NAME names, spelled as kubectl accepts it.
func kindOf(kind string) int {
	switch strings.ToLower(kind) {
	case "":
		return kindNone
	case "job", "jobs", "job.batch", "jobs.batch":
		return kindJob
	case "pod", "pods", "po":
		return kindPod
	case "lock", "locks", "dlock", "dlocks", "distributedlock", "distributedlocks",
		"distributedlock.locks.lockwarden.io", "distributedlocks.locks.lockwarden.io":
		return kindLock
	}
	return kindOther
}

// lockHint points a bare name that is neither a Job nor a Pod but a lock
// that derives its keys to why LOCK --key KEY; "" otherwise.
func lockHint(ctx context.Context, c client.Client, ns, name string) string {
	var dl locksv1alpha1.DistributedLock
	if c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &dl) != nil || dl.Spec.KeyFrom == nil {
		return ""
	}
	return fmt.Sprintf("; %s is a lock that derives its keys: why %s --key KEY explains one of its lanes", name, name)
}

// whyNamedJob explains the Job ns/name.
func whyNamedJob(ctx context.Context, c client.Client, ns, name string, out io.Writer, now time.Time) error {
	var job batchv1.Job
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &job); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("job %q not found in namespace %q", name, ns)
		}
		return fmt.Errorf("get job %q in namespace %q: %w", name, ns, err)
	}
	return whyJob(ctx, c, &job, out, now)
}

// whyJob writes the explanation for one Job.
func whyJob(ctx context.Context, c client.Client, job *batchv1.Job, out io.Writer, now time.Time) error {
	ns, name := job.Namespace, job.Name
	ref := fmt.Sprintf("Job %s/%s", ns, name)
	lockName := job.Annotations[locksv1alpha1.AnnotationLock]
	if lockName == "" {
		lockName = job.Labels[locksv1alpha1.LabelLock]
	}
	suspended := job.Spec.Suspend != nil && *job.Spec.Suspend
	a := job.Annotations
	var lines []string
	say := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }

	if lockName == "" {
		say("%s is not gated by lockwarden: it has no %s annotation.", ref, locksv1alpha1.AnnotationLock)
		if suspended {
			say("It is suspended (spec.suspend is true), but not by lockwarden: whoever created or suspended it decides when it runs.")
		}
		return writeLines(out, lines)
	}
	if _, gated := job.Labels[locksv1alpha1.LabelLock]; !gated {
		say("%s names lock %s but lockwarden has not gated it: it has no %s label, so the admission webhook did not admit it as a gated Job (was it created before the webhook ran, or in an excluded namespace?).",
			ref, lockName, locksv1alpha1.LabelLock)
		return writeLines(out, lines)
	}

	dl, lockErr := getLock(ctx, c, ns, lockName)
	finished, reason, message := finishedCondition(job)
	switch {
	case a[locksv1alpha1.AnnotationSkipped] != "":
		say("%s did not run: %s, and its contention is Skip (%s).", ref, a[locksv1alpha1.AnnotationSkipped], locksv1alpha1.AnnotationSkipped)
	case finished && reason == locksv1alpha1.JobReasonWaitTimedOut:
		say("%s did not run: it waited for lock %s longer than its maximum wait and ended Failed, reason %s: %s", ref, lockName, reason, message)
	case finished && reason == locksv1alpha1.JobReasonSuperseded:
		say("%s did not run: a newer Job of its CronJob joined the queue of lock %s (contention QueueLatest) and it ended Failed, reason %s: %s", ref, lockName, reason, message)
	case finished && reason == locksv1alpha1.JobReasonReplaced:
		say("%s did not run: a newer workload joined the queue of its key of lock %s (contention ReplaceQueued or CancelInProgress) and replaced it; it ended Failed, reason %s: %s", ref, lockName, reason, message)
	case cancelled(job):
		say("%s was cancelled: a newer Job of lock %s with contention CancelInProgress asked for its key while it ran with fencing token %s.", ref, lockName, a[locksv1alpha1.AnnotationFencingToken])
		if finished {
			say("Its pods were stopped and it ended Failed, reason %s; the lock was released once they had stopped.", reason)
		} else {
			say("Its pods are being stopped (within their termination grace period); the lock is released once they have, and the newer Job starts.")
		}
	case a[locksv1alpha1.AnnotationLost] != "":
		lost := a[locksv1alpha1.AnnotationLost]
		say("%s lost its lease on lock %s (%s: %s).", ref, lockName, locksv1alpha1.AnnotationLost, lost)
		if a[locksv1alpha1.AnnotationFencingToken] != "" {
			say("It held the lock with fencing token %s; a resource that checks fencing tokens refuses its writes once a newer holder wrote.", a[locksv1alpha1.AnnotationFencingToken])
		}
		if dl != nil {
			if dl.Spec.OnLost == locksv1alpha1.OnLostTerminate {
				say("The lock's onLost is Terminate: its pods were stopped (the Job is suspended).")
			} else {
				say("The lock's onLost is %s: the Job runs on without the lock.", dl.Spec.OnLost)
			}
		}
	case finished:
		say("%s has finished (%s) and no longer takes part in lock %s.", ref, reason, lockName)
	case !suspended && a[locksv1alpha1.AnnotationFencingToken] != "":
		say("%s is not suspended: it holds lock %s as %s with fencing token %s (its %s environment variable).",
			ref, lockName, a[locksv1alpha1.AnnotationHolder], a[locksv1alpha1.AnnotationFencingToken], locksv1alpha1.EnvFencingToken)
	case !suspended:
		say("%s is not suspended, but it does not hold lock %s (it has no %s annotation): it was unsuspended by someone other than lockwarden, which suspends it again.",
			ref, lockName, locksv1alpha1.AnnotationFencingToken)
	case lockErr != nil:
		say("%s is suspended by lockwarden: it waits for lock %s, but %v. It starts once the lock exists and it gets its turn.", ref, lockName, lockErr)
		return writeLines(out, lines)
	default:
		pos, length, queued := parsePosition(a[locksv1alpha1.AnnotationQueuePosition])
		if queued {
			say("%s is suspended by lockwarden: it waits for lock %s, position %d of %d in the queue (1 is next; %s).", ref, lockName, pos, length, locksv1alpha1.AnnotationQueuePosition)
		} else {
			say("%s is suspended by lockwarden: it waits for lock %s, and the operator has not placed it in the queue yet (no %s annotation).", ref, lockName, locksv1alpha1.AnnotationQueuePosition)
		}
		if wf := a[locksv1alpha1.AnnotationWaitingFor]; wf != "" {
			say("It waits behind: %s (%s).", wf, locksv1alpha1.AnnotationWaitingFor)
		}
		say("It has waited %s, since the Job was created.", humanSince(now, job.CreationTimestamp.Time))
	}
	if dl != nil {
		say("Lock %s (keys %s) %s.", dl.Name, lockKeys(dl), lockIs(dl, now))
		if waits := suspended && !finished && a[locksv1alpha1.AnnotationSkipped] == "" && a[locksv1alpha1.AnnotationFencingToken] == ""; waits {
			for _, l := range holdOrCooldown(dl, now) {
				say("%s", l)
			}
		}
		if c := backendProblem(dl); c != "" {
			say("%s", c)
		}
	}
	return writeLines(out, lines)
}

// holdOrCooldown says why a lock stays held for a while without a
// workload: a window of spec.holds is open (status.activeHold), or the keys
// cool down after a release (status.cooldownUntil).
func holdOrCooldown(dl *locksv1alpha1.DistributedLock, now time.Time) []string {
	var lines []string
	st := &dl.Status
	if h := st.ActiveHold; h != nil && h.End != nil {
		l := fmt.Sprintf("A freeze window is open: hold %s of spec.holds holds the lock until %s (in %s)",
			h.Name, h.End.UTC().Format(time.RFC3339), humanUntil(now, h.End.Time))
		if st.Holder != nil && st.Holder.Identity != "hold/"+h.Name {
			l += fmt.Sprintf(", as soon as %s releases it", st.Holder.Identity)
		}
		lines = append(lines, l+"; the Job waits until the window closes.")
	}
	if st.CooldownUntil != nil && st.CooldownUntil.After(now) {
		lines = append(lines, fmt.Sprintf("The lock cools down: its last holder released it, and the keys stay held for spec.cooldownSeconds (%ds), until %s (in %s).",
			dl.Spec.CooldownSeconds, st.CooldownUntil.UTC().Format(time.RFC3339), humanUntil(now, st.CooldownUntil.Time)))
	}
	return lines
}

// lockIs says who holds the lock, for a sentence that names it: "is held
// by ...", "is free: nobody holds it", or for a lock with keyFrom the counts
// of its lanes.
func lockIs(dl *locksv1alpha1.DistributedLock, now time.Time) string {
	switch {
	case dl.Spec.KeyFrom != nil && dl.Status.Lanes == nil:
		return "has no status.lanes yet: the operator has not reported on its lanes"
	case dl.Status.Lanes == nil && (dl.Status.Holder == nil || dl.Status.Holder.Identity == ""):
		return "is free: nobody holds it"
	}
	return "is " + heldBy(&dl.Status, now)
}

// humanUntil is how long until t, as kubectl shows durations.
func humanUntil(now, t time.Time) string {
	if !t.After(now) {
		return "0s"
	}
	return duration.HumanDuration(t.Sub(now))
}

// finishedCondition reports whether the Job has finished, with the reason
// and message of its Complete or Failed condition.
func finishedCondition(job *batchv1.Job) (finished bool, reason, message string) {
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			reason = c.Reason
			if reason == "" {
				reason = string(c.Type)
			}
			return true, reason, c.Message
		}
	}
	return false, "", ""
}

// cancelled tells whether a newer Job with contention CancelInProgress
// cancelled the Job (its FailureTarget or Failed reason is Cancelled).
func cancelled(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobFailureTarget || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue && c.Reason == locksv1alpha1.JobReasonCancelled {
			return true
		}
	}
	return false
}

// backendProblem says why a lock's backend cannot be used, or "" when it
// answers (or the operator has not reported yet).
func backendProblem(dl *locksv1alpha1.DistributedLock) string {
	for _, c := range dl.Status.Conditions {
		if c.Type == locksv1alpha1.ConditionBackendReady && c.Status != "True" {
			return fmt.Sprintf("Its backend %s is not ready (%s): %s", backendName(dl.Spec.Backend), c.Reason, c.Message)
		}
	}
	return ""
}

// writeLines writes one sentence a line. The sentences quote annotations and
// status, which come partly from the backend: each is escaped, so none adds
// a line or controls the terminal.
func writeLines(out io.Writer, lines []string) error {
	escaped := make([]string, len(lines))
	for i, l := range lines {
		escaped[i] = printable.String(l)
	}
	_, err := fmt.Fprintln(out, strings.Join(escaped, "\n"))
	return err
}
