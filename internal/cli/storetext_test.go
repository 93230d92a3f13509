package cli_test

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// status.holder, status.holders and status.waiting come from the lock's
// backend, which a tenant may own and write. An operator of an older version
// wrote them as they were; the plugin then prints them to an administrator
// (status -A, queue, why). They must not forge rows or reach the terminal as
// control sequences.
func TestStoreWrittenTextCannotForgeRowsOrControlTheTerminal(t *testing.T) {
	needEnv(t)
	ctx := testContext(t)
	ns := newNamespace(ctx, t)
	const forged = "x\nbilling   payments-prod   ledger   nobody   <none>   0   ClusterLockBackend/shared   Reachable   1d\x1b[2K\u202e"
	makeLock("evil", ns).create(ctx, t)
	now := time.Now()
	setStatus(ctx, t, ns, "evil", func(dl *locksv1alpha1.DistributedLock) {
		held(dl, forged, 7, now.Add(-time.Minute))
		setCondition(dl, locksv1alpha1.ConditionHeld, metav1.ConditionFalse, locksv1alpha1.ReasonHeldByOther, "The keys are held by "+forged)
		dl.Status.Waiting = []locksv1alpha1.WaiterStatus{{Identity: "w\r\x1b]0;owned\x07", Since: ptr.To(metav1.NewTime(now.Add(-time.Minute)))}}
		dl.Status.QueueLength = ptr.To[int32](1)
	})

	check := func(cmd, out string, lines int) {
		t.Helper()
		for _, c := range []string{"\x1b", "\r", "\x07", "\u202e"} {
			if strings.Contains(out, c) {
				t.Errorf("%s printed the store's %q to the terminal:\n%q", cmd, c, out)
			}
		}
		if lines > 0 && strings.Count(out, "\n") != lines {
			t.Errorf("%s printed %d lines, want %d: the store's text forged rows:\n%s", cmd, strings.Count(out, "\n"), lines, out)
		}
		if !strings.Contains(out, `x\nbilling`) {
			t.Errorf("%s does not show the identity with its line break escaped (x\\nbilling...):\n%s", cmd, out)
		}
	}
	check("status", mustRun(ctx, t, "status", "-n", ns), 2)
	check("status -o wide", mustRun(ctx, t, "status", "-n", ns, "-o", "wide"), 2)
	out := mustRun(ctx, t, "queue", "evil", "-n", ns)
	check("queue", out, 0)
	if !strings.Contains(out, `w\r\x1b]0;owned\a`) {
		t.Errorf("queue does not show the waiter with its control characters escaped:\n%s", out)
	}
}
