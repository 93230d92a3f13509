package manager

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/testpki"
)

// TestWebhookClientAuthReadiness: with --webhook-client-ca-file and
// --webhook-client-name, the webhook server answers a caller with a
// certificate of the CA and the name, refuses one without a certificate,
// with one from another CA or under another name, and its readiness check
// passes without a client certificate. It also records what
// controller-runtime's own check (a TLS handshake without a certificate)
// does against such a server. TestAPIServerAuthenticatesToTheWebhook
// (test/webhookauth) runs the same against a kube-apiserver.
func TestWebhookClientAuthReadiness(t *testing.T) {
	dir := t.TempDir()
	pki := testpki.NewCallers(t, dir)
	serverCA, err := testpki.NewCA("webhook-serving", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serving, err := serverCA.Issue(testpki.Leaf{CommonName: "webhook", Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := testpki.WriteFiles(map[string][]byte{filepath.Join(dir, "tls.crt"): serving.CertPEM, filepath.Join(dir, "tls.key"): serving.KeyPEM}); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	o, err := ParseFlags([]string{
		"--webhook-host=127.0.0.1", fmt.Sprintf("--webhook-port=%d", port), "--webhook-cert-dir=" + dir,
		"--webhook-client-ca-file=" + pki.CAFile, "--webhook-client-name=kube-apiserver",
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := newWebhookServer(o, nil)
	srv.Register("/ping", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "pong") }))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook server: %v", err)
		}
	})
	ready := webhookStarted(srv, o)
	waitFor(t, "the readiness check to pass", func() bool { return ready(nil) == nil })
	t.Logf("controller-runtime's StartedChecker against a server that requires client certificates: %v", srv.StartedChecker()(nil))

	url := fmt.Sprintf("https://127.0.0.1:%d/ping", port)
	resp, err := testpki.HTTPSClient(t, serverCA.PEM, pki.Trusted).Get(url)
	if err != nil {
		t.Fatalf("a caller with a certificate from the CA: %v", err)
	}
	_ = resp.Body.Close()
	for _, tc := range []struct {
		what string
		cert *testpki.KeyPair
		want string
	}{
		{"without a certificate", nil, "certificate required"},
		{"with a certificate from another CA", pki.Stranger, "unknown certificate authority"},
		{"with the CA's certificate for someone-else", pki.OtherName, "bad certificate"},
	} {
		resp, err := testpki.HTTPSClient(t, serverCA.PEM, tc.cert).Get(url)
		if err == nil {
			_ = resp.Body.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("a caller %s: %v; want the handshake refused (%s)", tc.what, err, tc.want)
		}
	}
}

// TestWebhookClientCAFileErrors: a missing or empty CA file, or names
// without it, stop the manager at start with a message naming the flag.
func TestWebhookClientCAFileErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--webhook-client-ca-file=" + filepath.Join(dir, "missing.crt")}, []string{"--webhook-client-ca-file", "missing.crt", "PEM"}},
		{[]string{"--webhook-client-ca-file=" + notPEM}, []string{"--webhook-client-ca-file", "ca.txt", "no PEM certificate"}},
		{[]string{"--webhook-client-name=kube-apiserver"}, []string{"--webhook-client-name", "needs --webhook-client-ca-file"}},
	} {
		_, err := ParseFlags(tc.args)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("ParseFlags(%q) = %v, want an error containing %q", tc.args, err, w)
			}
		}
	}
}
