package webhook

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
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
		return testAudit.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
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

// testAudit seals with a fixed test key.
var testAudit = &ForceReleaseAudit{Seal: func(namespace, lock, token, user string) string {
	return "seal(" + strings.Join([]string{namespace, lock, token, user}, ",") + ")"
}}

// audit sends an UPDATE of lock team-a/billing from old to ann by user
// through testAudit and returns the annotations it admits.
func audit(t *testing.T, old, ann map[string]string, user string) map[string]string {
	t.Helper()
	raw := func(a map[string]string) []byte {
		b, err := json.Marshal(metav1.PartialObjectMetadata{
			TypeMeta:   metav1.TypeMeta{APIVersion: "locks.lockwarden.io/v1alpha1", Kind: "DistributedLock"},
			ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: "team-a", Annotations: a},
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	obj := raw(ann)
	r := testAudit.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Update, Namespace: "team-a", Name: "billing",
		Object: runtime.RawExtension{Raw: obj}, OldObject: runtime.RawExtension{Raw: raw(old)},
		UserInfo: authenticationv1.UserInfo{Username: user},
	}})
	if !r.Allowed {
		t.Fatalf("refused: %v", r.Result)
	}
	if len(r.Patches) > 0 {
		ops, err := json.Marshal(r.Patches)
		if err != nil {
			t.Fatal(err)
		}
		patch, err := jsonpatch.DecodePatch(ops)
		if err != nil {
			t.Fatal(err)
		}
		if obj, err = patch.Apply(obj); err != nil {
			t.Fatal(err)
		}
	}
	var out metav1.PartialObjectMetadata
	if err := json.Unmarshal(obj, &out); err != nil {
		t.Fatal(err)
	}
	return out.Annotations
}

// TestForceReleaseAuditSealsWhoAsked: the webhook records the requesting
// user with the seal of (lock, token, user), whatever record the request
// brought; it drops a record that comes without a request; and it leaves
// an already recorded request alone when someone else edits the lock.
func TestForceReleaseAuditSealsWhoAsked(t *testing.T) {
	const (
		req   = locksv1alpha1.AnnotationForceRelease
		by    = locksv1alpha1.AnnotationForceReleaseBy
		seal  = locksv1alpha1.AnnotationForceReleaseSeal
		other = "example.com/note"
	)
	recorded := map[string]string{req: "42", by: "oncall", seal: "seal(team-a,billing,42,oncall)"}
	cases := map[string]struct {
		old, ann map[string]string
		user     string
		want     map[string]string
	}{
		"a request is recorded and sealed": {
			ann: map[string]string{req: "42"}, user: "oncall",
			want: recorded,
		},
		"a forged record and seal are replaced by who asked": {
			ann:  map[string]string{req: "42", by: "admin", seal: "seal(team-a,billing,42,admin)"},
			user: "mallory",
			want: map[string]string{req: "42", by: "mallory", seal: "seal(team-a,billing,42,mallory)"},
		},
		"a seal copied from another request is replaced": {
			old:  recorded,
			ann:  map[string]string{req: "43", by: "oncall", seal: "seal(team-a,billing,42,oncall)"},
			user: "mallory",
			want: map[string]string{req: "43", by: "mallory", seal: "seal(team-a,billing,43,mallory)"},
		},
		"a recorded request whose seal is edited is recorded again": {
			old: recorded, ann: map[string]string{req: "42", by: "oncall", seal: "forged"}, user: "mallory",
			want: map[string]string{req: "42", by: "mallory", seal: "seal(team-a,billing,42,mallory)"},
		},
		"a record without a request is dropped": {
			ann: map[string]string{by: "admin", seal: "seal(team-a,billing,42,admin)", other: "x"}, user: "mallory",
			want: map[string]string{other: "x"},
		},
		"a seal alone is dropped": {
			ann: map[string]string{seal: "anything"}, user: "mallory",
			want: nil,
		},
		"another edit leaves a recorded request as it is": {
			old: recorded, ann: map[string]string{req: "42", by: "oncall", seal: "seal(team-a,billing,42,oncall)", other: "x"}, user: "bob",
			want: map[string]string{req: "42", by: "oncall", seal: "seal(team-a,billing,42,oncall)", other: "x"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, audit(t, tc.old, tc.ann, tc.user), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("annotations (-want,+got):\n%s", diff)
			}
		})
	}
}
