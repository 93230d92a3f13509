// Package kubetest starts a real kube-apiserver and etcd (envtest) with
// lockwarden's CRDs installed, for controller, webhook and manager tests.
//
// The binaries come from $KUBEBUILDER_ASSETS (`make test` sets it); when it is
// unset, hack/control-plane.sh is asked for the cached directory, so a plain
// `go test ./...` works too once the binaries are cached.
package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
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
	// assets is the directory of the control plane's binaries.
	assets string
	// controllerManager is the kube-controller-manager StartControllers ran, if any.
	controllerManager *process
}

// process is a child process: exited is closed when it exited, with err
// its Wait result; dir is its temporary directory, removed when it is stopped.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
	dir    string
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

// WithAPIServerFlag adds a kube-apiserver flag to envtest's own, for
// example --admission-control-config-file.
func WithAPIServerFlag(name, value string) Option {
	return func(e *envtest.Environment, _ string) {
		e.ControlPlane.GetAPIServer().Configure().Append(name, value)
	}
}

// Webhook returns where the manager's webhook server must listen and the
// directory with its serving certificate (WithWebhooks only).
func (e *Env) Webhook() (host string, port int, certDir string) {
	o := e.env.WebhookInstallOptions
	return o.LocalServingHost, o.LocalServingPort, o.LocalServingCertDir
}

// WebhookCA returns the PEM certificate of the CA that signed the webhook
// serving certificate in Webhook's directory (WithWebhooks only).
func (e *Env) WebhookCA() []byte {
	return e.env.WebhookInstallOptions.LocalServingCAData
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
	return &Env{Config: cfg, Client: c, Scheme: s, env: env, assets: assets}, nil
}

// Stop stops the control plane (and the controllers StartControllers started).
func (e *Env) Stop() error {
	if p := e.controllerManager; p != nil {
		_ = p.cmd.Process.Kill()
		<-p.exited
		_ = os.RemoveAll(p.dir)
		e.controllerManager = nil
	}
	return e.env.Stop()
}

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

// AddUser provisions a user authenticated by a client certificate (common
// name name, organizations groups), as envtest's Environment.AddUser does, and
// returns a configuration that reaches the API server as that user. The user
// has no permissions until RBAC grants them: bind roles with e.Client. A name
// like system:serviceaccount:<namespace>:<name> is matched by RoleBindings to
// that ServiceAccount, as a real ServiceAccount token is.
func (e *Env) AddUser(name string, groups ...string) (*rest.Config, error) {
	u, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, fmt.Errorf("add user %q: %w", name, err)
	}
	return u.Config(), nil
}

// NewClient returns a direct (uncached) client for cfg with e.Scheme, for
// example for a configuration from AddUser.
func (e *Env) NewClient(cfg *rest.Config) (client.Client, error) {
	return client.New(cfg, client.Options{Scheme: e.Scheme})
}

// ReadManifests reads the Kubernetes objects in YAML files (several
// documents per file allowed; empty documents skipped). A relative path is
// relative to the module root, like config/rbac/role.yaml.
func ReadManifests(paths ...string) ([]*unstructured.Unstructured, error) {
	root, err := ModuleRoot()
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			p = filepath.Join(root, p)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("read %s: %w", p, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			objs = append(objs, &u)
		}
	}
	return objs, nil
}

// Apply creates or updates objs with server-side apply (field manager
// kubetest, conflicts forced), in order, as the administrator.
func (e *Env) Apply(ctx context.Context, objs ...*unstructured.Unstructured) error {
	for _, o := range objs {
		if err := e.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("kubetest"), client.ForceOwnership); err != nil {
			return fmt.Errorf("apply %s %s: %w", o.GetKind(), client.ObjectKeyFromObject(o), err)
		}
	}
	return nil
}

// Controllers of kube-controller-manager for StartControllers. envtest runs
// none: the API server alone neither aggregates ClusterRoles nor type-checks
// ValidatingAdmissionPolicies.
const (
	// ClusterRoleAggregation fills the aggregated ClusterRoles (admin, edit,
	// view) from the ClusterRoles labelled to aggregate into them.
	ClusterRoleAggregation = "clusterrole-aggregation-controller"
	// ValidatingAdmissionPolicyStatus type-checks ValidatingAdmissionPolicies
	// against the schemas of the kinds they match, into
	// status.typeChecking.
	ValidatingAdmissionPolicyStatus = "validatingadmissionpolicy-status-controller"
)

// StartControllers runs envtest's kube-controller-manager with only the
// named controllers (for example ClusterRoleAggregation), as a
// system:masters user, until Stop. Its output goes to
// kube-controller-manager.log in a temporary directory, named in errors.
func (e *Env) StartControllers(controllers ...string) error {
	if e.controllerManager != nil {
		return errors.New("kube-controller-manager runs already")
	}
	u, err := e.env.AddUser(envtest.User{Name: "kubetest:kube-controller-manager", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("add kube-controller-manager's user: %w", err)
	}
	kubeconfig, err := u.KubeConfig()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kubetest-kcm-")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "kubeconfig"), kubeconfig, 0o600); err != nil {
		return err
	}
	logPath := filepath.Join(dir, "kube-controller-manager.log")
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }() // the child keeps its own descriptor
	cmd := exec.Command(filepath.Join(e.assets, "kube-controller-manager"),
		"--kubeconfig="+filepath.Join(dir, "kubeconfig"),
		"--controllers="+strings.Join(controllers, ","),
		"--leader-elect=false",
		"--secure-port=0",
	)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start kube-controller-manager from %s: %w", e.assets, err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{}), dir: dir}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	// It has no health endpoint without a secure port: it runs if it did
	// not exit at once (a bad flag or controller name).
	select {
	case <-p.exited:
		return fmt.Errorf("kube-controller-manager exited (see %s): %w", logPath, p.err)
	case <-time.After(time.Second):
	}
	e.controllerManager = p
	return nil
}
