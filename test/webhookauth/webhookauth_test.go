// Package webhookauth runs the manager with caller authentication on its
// admission webhook (--webhook-client-ca-file) against a kube-apiserver
// configured to present a client certificate to webhooks, as a cluster
// administrator configures it, and calls the webhook as a pod would. It is
// a package of its own: a process runs one manager (controller names are
// unique per process).
package webhookauth

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/kubetest"
	"github.com/lockwarden/lockwarden/internal/testutil/managertest"
	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
	"github.com/lockwarden/lockwarden/internal/testutil/testpki"
)

// postReview posts an AdmissionReview for creating job to the webhook's
// Job gate at base, and returns the review answered, or the error.
func postReview(c *http.Client, base string, job *batchv1.Job) (*admissionv1.AdmissionReview, error) {
	raw, err := json.Marshal(job)
	if err != nil {
		return nil, err
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "0f2a5c1e-3b7d-4e8f-9a6b-1c2d3e4f5a6b",
			Kind:      metav1.GroupVersionKind{Group: "batch", Version: "v1", Kind: "Job"},
			Resource:  metav1.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"},
			Namespace: job.Namespace,
			Name:      job.Name,
			Operation: admissionv1.Create,
			Object:    runtime.RawExtension{Raw: raw},
		},
	}
	body, err := json.Marshal(&review)
	if err != nil {
		return nil, err
	}
	resp, err := c.Post(base+"/mutate-batch-v1-job", "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	var answer admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &answer); err != nil {
		return nil, err
	}
	if answer.Response == nil {
		return nil, fmt.Errorf("an AdmissionReview without a response: %s", b)
	}
	return &answer, nil
}

// refusedInHandshake fails the test unless err is the TLS alert of a
// server that refused the client's certificate (or its absence).
func refusedInHandshake(t *testing.T, what string, answer *admissionv1.AdmissionReview, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s was answered (allowed=%v, result %v); want the TLS handshake refused", what, answer.Response.Allowed, answer.Response.Result)
		return
	}
	// The server's alert; under TLS 1.3 it arrives with the first read.
	if !strings.Contains(err.Error(), "remote error: tls: ") {
		t.Errorf("%s failed with %v; want a TLS alert from the server", what, err)
		return
	}
	t.Logf("%s: refused: %v", what, err)
}

func gatedJob(namespace, name, lock string) *batchv1.Job {
	return &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: map[string]string{locksv1alpha1.AnnotationLock: lock}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "work", Image: "busybox"}},
		}}},
	}
}

// TestAPIServerAuthenticatesToTheWebhook: with --webhook-client-ca-file and
// --webhook-client-name, a real kube-apiserver that presents a client
// certificate from that CA (an AdmissionConfiguration's kubeConfigFile, as
// a cluster administrator configures it) still gets its Jobs gated, while
// a pod that posts its own AdmissionReviews straight to the webhook port is
// refused in the TLS handshake: without a certificate, with one from
// another CA, or with one of the CA under another name.
func TestAPIServerAuthenticatesToTheWebhook(t *testing.T) {
	dir := t.TempDir()
	pki := testpki.NewCallers(t, dir)
	certFile, keyFile := filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key")
	kubeconfig, admission := filepath.Join(dir, "webhook-kubeconfig"), filepath.Join(dir, "admission.yaml")
	if err := testpki.WriteFiles(map[string][]byte{
		certFile: pki.Trusted.CertPEM,
		keyFile:  pki.Trusted.KeyPEM,
		kubeconfig: fmt.Appendf(nil, `apiVersion: v1
kind: Config
users:
- name: "*"
  user:
    client-certificate: %s
    client-key: %s
`, certFile, keyFile),
		admission: fmt.Appendf(nil, `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %s
`, kubeconfig),
	}); err != nil {
		t.Fatal(err)
	}
	env := kubetest.Start(t, kubetest.WithWebhooks(), kubetest.WithAPIServerFlag("admission-control-config-file", admission))
	rdb := redistest.Start(t)
	mctx, stop := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	// managertest.Start returns once /readyz answers 200: the readiness
	// check needs no client certificate.
	if err := managertest.Start(mctx, env, env.Config, []string{
		// The manager keeps its own objects there.
		"--leader-election-namespace=default",
		"--metrics-bind-address=0",
		"--endpoint-allow=127.0.0.1/32",
		"--webhook-client-ca-file=" + pki.CAFile,
		"--webhook-client-name=kube-apiserver",
	}, stopped); err != nil {
		stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		if err := <-stopped; err != nil {
			t.Errorf("manager stopped with %v", err)
		}
	})

	ctx := context.Background()
	dl := &locksv1alpha1.DistributedLock{
		ObjectMeta: metav1.ObjectMeta{Name: "billing", Namespace: "default"},
		Spec: locksv1alpha1.DistributedLockSpec{
			Keys:    []string{"billing/ledger"},
			Backend: locksv1alpha1.Backend{Redis: &locksv1alpha1.RedisBackend{Endpoints: []string{rdb.Addr}}},
		},
	}
	if err := env.Client.Create(ctx, dl); err != nil {
		t.Fatalf("create DistributedLock: %v", err)
	}

	// (a) Through the API server: admitted and gated.
	job := gatedJob("default", "nightly", "billing")
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatalf("the API server could not create a gated Job (the webhook refused it?): %v", err)
	}
	if !ptr.Deref(job.Spec.Suspend, false) || job.Labels[locksv1alpha1.LabelLock] != "billing" {
		t.Fatalf("the Job was admitted ungated: suspend=%v labels=%v", ptr.Deref(job.Spec.Suspend, false), job.Labels)
	}

	host, port, _ := env.Webhook()
	base := fmt.Sprintf("https://%s:%d", host, port)
	probe := gatedJob("default", "probe", "billing")
	// The same request with the API server's certificate is answered: the
	// refusals below are the certificate's doing, not the request's.
	if answer, err := postReview(testpki.HTTPSClient(t, env.WebhookCA(), pki.Trusted), base, probe); err != nil || !answer.Response.Allowed {
		t.Fatalf("a review with the API server's certificate: %v (%+v); want it answered and allowed", err, answer)
	}
	// (b) A pod without a client certificate.
	answer, err := postReview(testpki.HTTPSClient(t, env.WebhookCA(), nil), base, probe)
	refusedInHandshake(t, "a review without a client certificate", answer, err)
	// (c) A certificate from another CA, even with the right name.
	answer, err = postReview(testpki.HTTPSClient(t, env.WebhookCA(), pki.Stranger), base, probe)
	refusedInHandshake(t, "a review with a certificate from another CA", answer, err)
	// A certificate from the CA that names someone else.
	answer, err = postReview(testpki.HTTPSClient(t, env.WebhookCA(), pki.OtherName), base, probe)
	refusedInHandshake(t, "a review with the CA's certificate for someone-else", answer, err)
}
