package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// laneNow is the clock of the lane tests.
var laneNow = time.Date(2027, 3, 1, 2, 10, 0, 0, time.UTC)

// laneJob is a Job of lock deploys given key at admission: waiting at
// queue position pos ("" for not placed yet) when fence is "", else
// holding the key with fence since it started 5 minutes ago.
func laneJob(name, key, pos, fence string) *batchv1.Job {
	a := map[string]string{locksv1alpha1.AnnotationLock: "deploys", locksv1alpha1.AnnotationKey: key}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, CreationTimestamp: metav1.NewTime(laneNow.Add(-3 * time.Minute)),
		Labels: map[string]string{locksv1alpha1.LabelLock: "deploys"}, Annotations: a}}
	if fence == "" {
		job.Spec.Suspend = ptr.To(true)
		if pos != "" {
			a[locksv1alpha1.AnnotationQueuePosition] = pos
		}
		return job
	}
	a[locksv1alpha1.AnnotationFencingToken] = fence
	a[locksv1alpha1.AnnotationHolder] = "east/" + ns + "/Job/" + name + "/abcde"
	job.Spec.Suspend = ptr.To(false)
	job.Status.StartTime = ptr.To(metav1.NewTime(laneNow.Add(-5 * time.Minute)))
	return job
}

// lanesLock is lock deploys deriving its keys, with status.lanes as the
// operator writes it: deploy/prod and deploy/dev among the busiest.
func lanesLock(mutate ...func(*locksv1alpha1.DistributedLock)) *locksv1alpha1.DistributedLock {
	return testLock("deploys", append([]func(*locksv1alpha1.DistributedLock){func(dl *locksv1alpha1.DistributedLock) {
		dl.Spec.Keys, dl.Spec.KeyFrom = nil, &locksv1alpha1.KeyFrom{Expression: `"deploy/" + object.metadata.labels["env"]`}
		dl.Status.Holder = nil
		dl.Status.ObservedGeneration = 1
		dl.Status.Lanes = &locksv1alpha1.LanesStatus{Keys: 3, Holders: 3, Waiting: 3, Busiest: []locksv1alpha1.LaneStatus{
			{Key: "deploy/prod", Holders: 1, Waiting: 2, FencingToken: 41}, {Key: "deploy/dev", Holders: 1, Waiting: 1, FencingToken: 40}}}
	}}, mutate...)...)
}

// laneClient holds lock deploys (and billing, with fixed keys) and the
// Jobs and Pods of its lanes in ns: deploy/prod held by a Job, waited for
// by a Job and a gated Pod; deploy/dev held by another Job; deploy/web, not
// among the busiest, held by Deployment web for its two Pods, with a
// finished Job that takes no part.
func laneClient(lock *locksv1alpha1.DistributedLock) client.Client {
	webPod := func(name string) *corev1.Pod {
		p := makePod(name).gated("deploys").of("Deployment", "web").
			annotate(locksv1alpha1.AnnotationKey, "deploy/web", locksv1alpha1.AnnotationHolderMode, "Workload").
			holding("12", "east/"+ns+"/Deployment/web/9e8d7").obj()
		p.Status.StartTime = ptr.To(metav1.NewTime(laneNow.Add(-4 * time.Hour)))
		return p
	}
	waitingPod := makePod("prod-canary").gated("deploys").annotate(locksv1alpha1.AnnotationKey, "deploy/prod",
		locksv1alpha1.AnnotationQueuePosition, "2/2").obj()
	waitingPod.CreationTimestamp = metav1.NewTime(laneNow.Add(-time.Minute))
	first := laneJob("prod-2", "deploy/prod", "1/2", "")
	first.Annotations[locksv1alpha1.AnnotationWaitingFor] = "held by east/team-a/Job/prod-1/abcde (fencing token 41)"
	done := laneJob("web-old", "deploy/web", "", "11")
	done.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(lock, testLock("billing"),
		laneJob("prod-1", "deploy/prod", "", "41"), first, waitingPod,
		laneJob("dev-1", "deploy/dev", "", "40"), webPod("web-a"), webPod("web-b"), done).Build()
}

func laneStatus(t *testing.T, c client.Client, key string) string {
	t.Helper()
	v, err := readLane(context.Background(), c, ns, "deploys", key)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := v.printStatus(&out, laneNow); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func wantLines(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s does not say %q:\n%s", what, w, out)
		}
	}
}

// TestStatusKeyShowsOneLane: status LOCK --key K names who holds the lane
// in the namespace with their fencing tokens, how many wait, and the
// lane's counts when status.lanes lists it among the busiest.
func TestStatusKeyShowsOneLane(t *testing.T) {
	c := laneClient(lanesLock())

	prod := laneStatus(t, c, "deploy/prod")
	wantLines(t, "status deploys --key deploy/prod", prod,
		"Lock team-a/deploys (keys derived: \"deploy/\" + object.metadata.labels[\"env\"]): using 3 derived key(s), with 3 holder(s) and 3 waiting;",
		"Key deploy/prod is among the busiest keys of status.lanes: 1 holding (newest fencing token 41), 2 waiting (in every cluster sharing the store).\n",
		"Held in this namespace by 1 holder(s):\n",
		"2 Job(s) or Pod(s) of this namespace wait for it; the first, Job/prod-2 (position 1 of 2), has waited 3m.\n",
		"kubectl lockwarden why deploys --key deploy/prod says why they wait.\n")
	if got, want := tableRows(prod), [][]string{{"HOLDER", "FENCE", "HOLDING", "JOBS/PODS"}, {"east/team-a/Job/prod-1/abcde", "41", "5m", "Job/prod-1"}}; !equalRows(got, want) {
		t.Errorf("status --key deploy/prod holders = %q, want %q", got, want)
	}
	if strings.Contains(prod, "dev-1") || strings.Contains(prod, "web-a") {
		t.Errorf("status --key deploy/prod shows another lane's workload:\n%s", prod)
	}

	// The Pods of a Deployment in holder mode Workload keep one lease: one holder.
	web := laneStatus(t, c, "deploy/web")
	wantLines(t, "status deploys --key deploy/web", web,
		"Key deploy/web is not among the busiest keys of status.lanes, which has no counts for it; below are the Jobs and Pods of this namespace.\n",
		"Nothing of this namespace waits for it.\n")
	if got, want := tableRows(web), [][]string{{"HOLDER", "FENCE", "HOLDING", "JOBS/PODS"}, {"east/team-a/Deployment/web/9e8d7", "12", "4h", "Pod/web-a,Pod/web-b"}}; !equalRows(got, want) {
		t.Errorf("status --key deploy/web holders = %q, want %q (the finished Job web-old takes no part)", got, want)
	}

	qa := laneStatus(t, c, "deploy/qa")
	wantLines(t, "status deploys --key deploy/qa", qa,
		"Nothing holds or waits for key deploy/qa: no Job or Pod of lock deploys in namespace team-a has lockwarden.io/key deploy/qa, and it is not among the busiest keys of status.lanes.\n")

	// Held only elsewhere: status.lanes counts a holder no Job or Pod here is.
	elsewhere := laneClient(lanesLock(func(dl *locksv1alpha1.DistributedLock) {
		dl.Status.Lanes.Busiest = append(dl.Status.Lanes.Busiest, locksv1alpha1.LaneStatus{Key: "deploy/eu", Holders: 1, FencingToken: 7})
	}))
	wantLines(t, "status deploys --key deploy/eu", laneStatus(t, elsewhere, "deploy/eu"),
		"No Job or Pod of this namespace holds it: status.lanes counts 1 holder(s), in another cluster or through another lock that derives the same key.\n")
	// With a cooldown, the key may be cooling down after its holder here.
	cooling := laneClient(lanesLock(func(dl *locksv1alpha1.DistributedLock) {
		dl.Spec.CooldownSeconds = 300
		dl.Status.Lanes.Busiest = append(dl.Status.Lanes.Busiest, locksv1alpha1.LaneStatus{Key: "deploy/eu", Holders: 1, FencingToken: 7})
	}))
	wantLines(t, "status deploys --key deploy/eu with a cooldown", laneStatus(t, cooling, "deploy/eu"),
		"No Job or Pod of this namespace holds it: status.lanes counts 1 holder(s), in another cluster or through another lock that derives the same key, or a lease cooling down for spec.cooldownSeconds (300s) after its holder released it.\n")

	if _, err := readLane(context.Background(), c, ns, "billing", "deploy/prod"); err == nil ||
		err.Error() != `--key "deploy/prod": lock "billing" has fixed keys (billing/main); --key selects one derived key of a lock with spec.keyFrom` {
		t.Errorf("status billing --key deploy/prod: %v", err)
	}
}

// TestStatusKeyNeedsOneLock: --key names a lane of one lock; with -A,
// several names, none, or -o, status says what is wrong before it
// connects.
func TestStatusKeyNeedsOneLock(t *testing.T) {
	for args, want := range map[string]string{
		"status --key deploy/prod -A":                 `--key "deploy/prod" shows a lane of one lock: name the lock in one namespace with -n, not -A`,
		"status deploys builds --key deploy/prod":     `--key "deploy/prod" shows a lane of one lock, got 2: deploys builds`,
		"status --key deploy/prod":                    `--key "deploy/prod" needs the lock whose lane it is: kubectl lockwarden status LOCK --key deploy/prod`,
		"status deploys --key deploy/prod -o yaml":    `--key "deploy/prod" prints one lane as text: drop -o yaml, or drop --key to print the lock as yaml`,
		"status deploys -A --key deploy/prod -o wide": `name the lock in one namespace with -n, not -A`,
		"status deploys --key=":                       `--key needs a derived key: kubectl lockwarden status LOCK --key KEY, for example --key deploy/prod`,
		"queue deploys --key=":                        `--key needs a derived key: kubectl lockwarden queue LOCK --key KEY, for example --key deploy/prod`,
	} {
		streams, _, _, _ := genericiooptions.NewTestIOStreams()
		cmd := NewCommand(streams)
		cmd.SetArgs(strings.Fields(args))
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", args, err, want)
		}
	}
}

// tableRows splits a command's aligned table (the lines with two or more
// columns after a blank line) into fields.
func tableRows(out string) [][]string {
	var rows [][]string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && (rows != nil || f[0] == "HOLDER") && !strings.HasSuffix(l, ".") {
			rows = append(rows, f)
		} else if rows != nil {
			break
		}
	}
	return rows
}

func equalRows(a, b [][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if strings.Join(a[i], "\t") != strings.Join(b[i], "\t") {
			return false
		}
	}
	return true
}
