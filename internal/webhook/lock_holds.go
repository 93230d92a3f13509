package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/keyfrom"
	"github.com/lockwarden/lockwarden/internal/schedule"
)

// LockSpecPath is where LockSpecCheck is served.
const LockSpecPath = "/validate-locks-lockwarden-io-v1alpha1-distributedlock"

// LockSpecCheck refuses a DistributedLock whose spec the CRD cannot judge:
//   - spec.keyFrom that does not compile, gives no string (its guard no
//     bool), or may cost more than keyfrom.CostLimit;
//   - spec.holds that cannot be run: a schedule that is not a 5-field cron
//     schedule, an unknown time zone, or windows as long as the schedule's
//     period.
//
// The CRD checks what it can (names, lengths, ranges); compiling CEL or
// reading a cron schedule or a time zone needs code. The webhook
// configuration sends it only locks with keyFrom or holds; it only allows
// or denies, it changes nothing.
type LockSpecCheck struct {
	// Clock places the schedule's periods (default: the real clock).
	Clock clock.PassiveClock
}

// SetupWithManager registers the webhook at LockSpecPath.
func (v *LockSpecCheck) SetupWithManager(mgr ctrl.Manager) {
	mgr.GetWebhookServer().Register(LockSpecPath, &admission.Webhook{Handler: v})
}

// Handle implements admission.Handler.
func (v *LockSpecCheck) Handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	var dl locksv1alpha1.DistributedLock
	if err := json.Unmarshal(req.Object.Raw, &dl); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	now := time.Now()
	if v.Clock != nil {
		now = v.Clock.Now()
	}
	if dl.Spec.KeyFrom != nil {
		if _, err := keyfrom.Compile(dl.Spec.KeyFrom); err != nil {
			return admission.Denied(err.Error())
		}
	}
	if errs := ValidateHolds(dl.Spec.Holds, now); len(errs) > 0 {
		return admission.Denied(errs.ToAggregate().Error())
	}
	return admission.Allowed("")
}

// ValidateHolds checks each of spec.holds as the operator will read it;
// each error names its field, spec.holds[i].schedule for example, and says
// what would be valid.
func ValidateHolds(holds []locksv1alpha1.RecurringHold, now time.Time) field.ErrorList {
	var errs field.ErrorList
	for i, h := range holds {
		p := field.NewPath("spec", "holds").Index(i)
		err := schedule.Validate(h.Schedule, h.TimeZone, time.Duration(h.DurationSeconds)*time.Second, now)
		var fe *schedule.FieldError
		switch {
		case err == nil:
		case errors.As(err, &fe):
			var value any
			switch fe.Field {
			case "schedule":
				value = h.Schedule
			case "timeZone":
				value = h.TimeZone
			default:
				value = h.DurationSeconds
			}
			errs = append(errs, field.Invalid(p.Child(fe.Field), value, fe.Detail))
		default:
			errs = append(errs, field.Invalid(p, h.Name, err.Error()))
		}
	}
	return errs
}
