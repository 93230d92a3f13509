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
// lockwarden.io/force-release-by to the requesting user and
// lockwarden.io/force-release-seal to the request's seal (Seal), without
// which the operator refuses the request; a record that nobody asked for
// with a force-release is removed. It refuses a force-release that is not a
// fencing token. The webhook configuration sends it only requests whose
// object carries one of the annotations, so it never stands in the way of
// other lock updates.
type ForceReleaseAudit struct {
	// Seal seals a request (holder.Tokens.ForceReleaseSeal): the lock's
	// namespace and name, the token and the user.
	Seal func(namespace, lock, token, user string) string
}

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
	seal, sealed := ann[locksv1alpha1.AnnotationForceReleaseSeal]
	oldAnn := old.GetAnnotations()
	switch {
	case !asked && !stamped && !sealed:
		return admission.Allowed("")
	case !asked:
		// A record without a request: nobody may write one by hand.
		return patchAnnotations(req, ann, map[string]*string{locksv1alpha1.AnnotationForceReleaseBy: nil, locksv1alpha1.AnnotationForceReleaseSeal: nil})
	}
	if f, err := strconv.ParseInt(token, 10, 64); err != nil || f <= 0 || f >= lock.MaxFence || strconv.FormatInt(f, 10) != token {
		return admission.Denied(fmt.Sprintf("metadata.annotations[%s]: %q is not a fencing token: give the token of the holder to release, a positive integer as status.holders[].fencingToken shows it", locksv1alpha1.AnnotationForceRelease, token))
	}
	if stamped && sealed && token == oldAnn[locksv1alpha1.AnnotationForceRelease] &&
		by == oldAnn[locksv1alpha1.AnnotationForceReleaseBy] && seal == oldAnn[locksv1alpha1.AnnotationForceReleaseSeal] {
		return admission.Allowed("") // unchanged request, already recorded
	}
	user := req.UserInfo.Username
	if user == "" {
		user = "(unknown user)"
	}
	seal = a.Seal(req.Namespace, req.Name, token, user)
	return patchAnnotations(req, ann, map[string]*string{locksv1alpha1.AnnotationForceReleaseBy: &user, locksv1alpha1.AnnotationForceReleaseSeal: &seal})
}

// patchAnnotations answers with the object's annotations with each key of
// set set to its value (removed where the value is nil).
func patchAnnotations(req admission.Request, ann map[string]string, set map[string]*string) admission.Response {
	var obj map[string]any
	if err := json.Unmarshal(req.Object.Raw, &obj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	out := make(map[string]any, len(ann)+len(set))
	for k, v := range ann {
		out[k] = v
	}
	for k, v := range set {
		if v == nil {
			delete(out, k)
		} else {
			out[k] = *v
		}
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
