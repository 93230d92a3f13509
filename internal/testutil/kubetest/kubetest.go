// Package kubetest starts a real kube-apiserver and etcd (envtest) with
// lockwarden's CRDs installed, for controller, webhook and manager tests.
//
// The binaries come from $KUBEBUILDER_ASSETS (`make test` sets it); when it is
// unset, hack/control-plane.sh is asked for the cached directory, so a plain
// `go test ./...` works too once the binaries are cached.
package kubetest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Env is a running control plane.
type Env struct {
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a direct (uncached) client, for assertions.
	Client client.Client
	// Scheme knows the built-in kinds and lockwarden's.
	Scheme *runtime.Scheme

	env *envtest.Environment
}

// Scheme returns a scheme with client-go's kinds and lockwarden's API.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(locksv1alpha1.AddToScheme(s))
	return s
}

// Option configures a control plane.
type Option func(*envtest.Environment, string)

// WithWebhooks installs lockwarden's webhook configuration (config/webhook),
// pointed at a local port with a generated certificate; see Env.Webhook.
func WithWebhooks() Option {
	return func(e *envtest.Environment, root string) {
		e.WebhookInstallOptions = envtest.WebhookInstallOptions{
			Paths: []string{filepath.Join(root, "config", "webhook", "manifests.yaml")},
		}
	}
}

// Webhook returns where the manager's webhook server must listen and the
// directory with its serving certificate (WithWebhooks only).
func (e *Env) Webhook() (host string, port int, certDir string) {
	o := e.env.WebhookInstallOptions
	return o.LocalServingHost, o.LocalServingPort, o.LocalServingCertDir
}

// Start starts a control plane for one test and stops it when the test ends.
// With -short it skips the test instead.
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	if testing.Short() {
		t.Skip("starts kube-apiserver and etcd; skipped with -short")
	}
	e, err := StartEnv(opts...)
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	return e
}

// StartEnv starts a control plane; the caller stops it (for TestMain).
func StartEnv(opts ...Option) (*Env, error) {
	root, err := ModuleRoot()
	if err != nil {
		return nil, err
	}
	assets, err := assetsDir(root)
	if err != nil {
		return nil, err
	}
	s := Scheme()
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assets,
		Scheme:                s,
	}
	for _, o := range opts {
		o(env, root)
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start kube-apiserver and etcd from %s: %w", assets, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		_ = env.Stop()
		return nil, fmt.Errorf("create client: %w", err)
	}
	return &Env{Config: cfg, Client: c, Scheme: s, env: env}, nil
}

// Stop stops the control plane.
func (e *Env) Stop() error { return e.env.Stop() }

// ModuleRoot returns the directory of lockwarden's go.mod.
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/lockwarden/lockwarden\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("lockwarden's go.mod not found above the working directory")
		}
		dir = parent
	}
}

func assetsDir(root string) (string, error) {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d, nil
	}
	cmd := exec.Command(filepath.Join(root, "hack", "control-plane.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("KUBEBUILDER_ASSETS is unset and hack/control-plane.sh failed (%w): run `make test`", err)
	}
	return strings.TrimSpace(string(out)), nil
}
