package webhook

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// TestLockSpecCheckRefusesBadHoldsNamingTheField: a lock with a schedule
// that does not parse, an unknown time zone, or windows as long as their
// period is refused, and the message names the field (spec.holds[i].x) and
// says what would be valid; a good hold, Europe/Berlin at 01:00 for two
// hours, is admitted.
func TestLockSpecCheckRefusesBadHoldsNamingTheField(t *testing.T) {
	v := &LockSpecCheck{Clock: testingclock.NewFakePassiveClock(time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC))}
	handle := func(holds ...locksv1alpha1.RecurringHold) admission.Response {
		dl := locksv1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Name: "deploys", Namespace: "team-a"},
			Spec: locksv1alpha1.DistributedLockSpec{
				Keys:    []string{"deploys"},
				Holds:   holds,
				Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{"redis:6379"}}},
			},
		}
		raw, err := json.Marshal(dl)
		if err != nil {
			t.Fatal(err)
		}
		return v.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Create, Namespace: "team-a", Name: "deploys", Object: runtime.RawExtension{Raw: raw},
		}})
	}
	good := locksv1alpha1.RecurringHold{Name: "nightly", Schedule: "0 1 * * *", DurationSeconds: 7200, TimeZone: "Europe/Berlin"}
	if r := handle(good); !r.Allowed {
		t.Fatalf("a good hold was refused: %v", r.Result)
	}
	for _, tc := range []struct {
		name  string
		hold  locksv1alpha1.RecurringHold
		field string
		hint  string
	}{
		{"hour 25", locksv1alpha1.RecurringHold{Name: "bad", Schedule: "0 25 * * *", DurationSeconds: 60}, "spec.holds[1].schedule", "minute hour day-of-month month day-of-week"},
		{"words", locksv1alpha1.RecurringHold{Name: "bad", Schedule: "every night", DurationSeconds: 60}, "spec.holds[1].schedule", "for example"},
		{"unknown zone", locksv1alpha1.RecurringHold{Name: "bad", Schedule: "0 1 * * *", DurationSeconds: 60, TimeZone: "Europe/Berlín"}, "spec.holds[1].timeZone", "Europe/Berlin"},
		{"longer than a day", locksv1alpha1.RecurringHold{Name: "bad", Schedule: "0 1 * * *", DurationSeconds: 86400, TimeZone: "UTC"}, "spec.holds[1].durationSeconds", "give at most 86399"},
		{"zero", locksv1alpha1.RecurringHold{Name: "bad", Schedule: "0 1 * * *"}, "spec.holds[1].durationSeconds", "at least 1"},
	} {
		r := handle(good, tc.hold)
		if r.Allowed || r.Result == nil {
			t.Errorf("%s: admitted", tc.name)
			continue
		}
		if msg := r.Result.Message; !strings.Contains(msg, tc.field+":") || !strings.Contains(msg, tc.hint) {
			t.Errorf("%s: refused with %q, want it to name %s and say %q", tc.name, msg, tc.field, tc.hint)
		}
	}
}

// TestLockSpecCheckRefusesAKeyFromThatCannotGiveAKey: a lock whose
// expression does not compile or gives no string is refused when applied,
// naming spec.keyFrom.expression; a good one is admitted.
func TestLockSpecCheckRefusesAKeyFromThatCannotGiveAKey(t *testing.T) {
	handle := func(expr string) admission.Response {
		dl := locksv1alpha1.DistributedLock{
			ObjectMeta: metav1.ObjectMeta{Name: "deploys", Namespace: "team-a"},
			Spec:       locksv1alpha1.DistributedLockSpec{KeyFrom: &locksv1alpha1.KeyFrom{Expression: expr}},
		}
		raw, err := json.Marshal(dl)
		if err != nil {
			t.Fatal(err)
		}
		return (&LockSpecCheck{}).Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Create, Namespace: "team-a", Name: "deploys", Object: runtime.RawExtension{Raw: raw},
		}})
	}
	if r := handle(`"deploy/" + object.metadata.labels["env"]`); !r.Allowed {
		t.Fatalf("a good expression was refused: %v", r.Result)
	}
	for _, expr := range []string{`object.metadata.labels["env"] + 1`, `"deploy/" +`, `size(object.metadata.labels)`} {
		if r := handle(expr); r.Allowed || r.Result == nil || !strings.Contains(r.Result.Message, "spec.keyFrom.expression") {
			t.Errorf("keyFrom %s: allowed %v, %v; want a refusal naming spec.keyFrom.expression", expr, r.Allowed, r.Result)
		}
	}
}
