package webhook

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/lock"
)

// A force release names a fencing token: a positive integer in canonical
// form, at most the largest token a backend issues (MaxFence - 1).
func TestForceReleaseAuditRefusesWhatIsNotAToken(t *testing.T) {
	handle := func(token string) admission.Response {
		obj := metav1.PartialObjectMetadata{
			TypeMeta:   metav1.TypeMeta{APIVersion: "locks.lockwarden.io/v1alpha1", Kind: "DistributedLock"},
			ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: "team-a", Annotations: map[string]string{locksv1alpha1.AnnotationForceRelease: token}},
		}
		raw, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		return (&ForceReleaseAudit{}).Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Update,
			Object:    runtime.RawExtension{Raw: raw},
			UserInfo:  authenticationv1.UserInfo{Username: "alice"},
		}})
	}
	largest := strconv.FormatInt(lock.MaxFence-1, 10)
	for _, token := range []string{"1", "42", largest} {
		if r := handle(token); !r.Allowed {
			t.Errorf("force release of token %q refused: %v", token, r.Result)
		}
	}
	for _, token := range []string{"0", "-1", "007", "abc", "", strconv.FormatInt(lock.MaxFence, 10), "9223372036854775808"} {
		r := handle(token)
		if r.Allowed {
			t.Errorf("force release of %q allowed, want it refused as not a fencing token", token)
			continue
		}
		if msg := r.Result.Message; !strings.Contains(msg, locksv1alpha1.AnnotationForceRelease) || !strings.Contains(msg, "not a fencing token") {
			t.Errorf("refusal of %q = %q; want it to name the annotation and say it is not a fencing token", token, msg)
		}
	}
}
