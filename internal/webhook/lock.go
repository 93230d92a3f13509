package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/lock"
)

// ForceReleasePath is where ForceReleaseAudit is served.
const ForceReleasePath = "/mutate-locks-lockwarden-io-v1alpha1-distributedlock-force-release"

// ForceReleaseAudit records who asks for a force release: when a request
// sets or changes a DistributedLock's lockwarden.io/force-release, it sets
// lockwarden.io/force-release-by to the requesting user; a
// force-release-by that nobody asked for with a force-release is removed.
// It refuses a force-release that is not a fencing token. The webhook
// configuration sends it only requests whose object carries either
// annotation, so it never stands in the way of other lock updates.
type ForceReleaseAudit struct{}

// SetupWithManager registers the webhook at ForceReleasePath.
func (a *ForceReleaseAudit) SetupWithManager(mgr ctrl.Manager) {
	mgr.GetWebhookServer().Register(ForceReleasePath, &admission.Webhook{Handler: a})
}

// Handle implements admission.Handler.
func (a *ForceReleaseAudit) Handle(_ context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	var obj, old metav1.PartialObjectMetadata
	if err := json.Unmarshal(req.Object.Raw, &obj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if len(req.OldObject.Raw) > 0 {
		if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
	}
	ann := obj.GetAnnotations()
	token, asked := ann[locksv1alpha1.AnnotationForceRelease]
	by, stamped := ann[locksv1alpha1.AnnotationForceReleaseBy]
	oldAnn := old.GetAnnotations()
	switch {
	case !asked && !stamped:
		return admission.Allowed("")
	case !asked:
		// A record without a request: nobody may write one by hand.
		return patchAnnotations(req, ann, locksv1alpha1.AnnotationForceReleaseBy, nil)
	}
	if f, err := strconv.ParseInt(token, 10, 64); err != nil || f <= 0 || f >= lock.MaxFence || strconv.FormatInt(f, 10) != token {
		return admission.Denied(fmt.Sprintf("metadata.annotations[%s]: %q is not a fencing token: give the token of the holder to release, a positive integer as status.holders[].fencingToken shows it", locksv1alpha1.AnnotationForceRelease, token))
	}
	if token == oldAnn[locksv1alpha1.AnnotationForceRelease] && by == oldAnn[locksv1alpha1.AnnotationForceReleaseBy] && stamped {
		return admission.Allowed("") // unchanged request, already recorded
	}
	user := req.UserInfo.Username
	if user == "" {
		user = "(unknown user)"
	}
	return patchAnnotations(req, ann, locksv1alpha1.AnnotationForceReleaseBy, &user)
}

// patchAnnotations answers with the object's annotations with key set to
// value (removed when value is nil).
func patchAnnotations(req admission.Request, ann map[string]string, key string, value *string) admission.Response {
	var obj map[string]any
	if err := json.Unmarshal(req.Object.Raw, &obj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	out := make(map[string]any, len(ann)+1)
	for k, v := range ann {
		out[k] = v
	}
	if value == nil {
		delete(out, key)
	} else {
		out[key] = *value
	}
	md, _ := obj["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
		obj["metadata"] = md
	}
	md["annotations"] = out
	patched, err := json.Marshal(obj)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, patched)
}
