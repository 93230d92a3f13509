// Command lockwarden is the lockwarden manager: it runs the DistributedLock
// and Job controllers and the admission webhook.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/open-policy-agent/cert-controller/pkg/rotator"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	redislock "github.com/lockwarden/lockwarden/internal/lock/redis"
	"github.com/lockwarden/lockwarden/internal/watchdog"
	"github.com/lockwarden/lockwarden/internal/webhook"
)

// leaderElectionID names the coordination.k8s.io Lease the managers elect a leader with.
const leaderElectionID = "lockwarden.locks.lockwarden.io"

// options are the manager's command-line settings.
type options struct {
	metricsAddr          string
	metricsSecure        bool
	probeAddr            string
	enableLeaderElection bool
	leaderElectionNS     string
	leaseDuration        time.Duration
	renewDeadline        time.Duration
	retryPeriod          time.Duration
	enableHTTP2          bool
	clusterName          string
	allowGlobalScope     bool
	globalScopeLabel     string
	ownerKeySecret       string
	resyncPeriod         time.Duration
	enableWebhook        bool
	webhookPort          int
	webhookHost          string
	webhookCertDir       string
	webhookCertMode      string
	webhookService       string
	webhookConfigName    string
	namespace            string
	kubeconfig           string
	zap                  zap.Options
}

// Webhook certificate modes.
const (
	certModeSelfSigned = "self-signed"
	certModeExternal   = "external"
)

// defaultNamespace is where the manager keeps its own objects when neither
// POD_NAMESPACE nor --leader-election-namespace says otherwise.
const defaultNamespace = "lockwarden-system"

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(locksv1alpha1.AddToScheme(s))
	return s
}

// parseFlags parses args into options; errors name the flag.
func parseFlags(args []string) (*options, error) {
	o := &options{zap: zap.Options{Development: false}}
	fs := flag.NewFlagSet("lockwarden", flag.ContinueOnError)
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", "0",
		"Address the Prometheus metrics endpoint binds to, for example :8443 (HTTPS) or :8080 (HTTP with --metrics-secure=false). 0 disables it.")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", true,
		"Serve metrics over HTTPS, allowing only callers that Kubernetes authenticates and authorizes for GET /metrics.")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address the /healthz and /readyz probes bind to.")
	fs.BoolVar(&o.enableLeaderElection, "leader-elect", false,
		"Elect a leader among the manager's replicas; only the leader acquires and renews leases.")
	fs.StringVar(&o.leaderElectionNS, "leader-election-namespace", "",
		"Namespace of the leader election Lease. Default: the namespace the manager runs in.")
	fs.DurationVar(&o.leaseDuration, "leader-election-lease-duration", 15*time.Second,
		"How long a non-leader waits before taking over from a silent leader.")
	fs.DurationVar(&o.renewDeadline, "leader-election-renew-deadline", 10*time.Second,
		"How long the leader keeps retrying to renew leadership before it gives up.")
	fs.DurationVar(&o.retryPeriod, "leader-election-retry-period", 2*time.Second,
		"How often leader election clients retry.")
	fs.BoolVar(&o.enableHTTP2, "enable-http2", false,
		"Serve the metrics and webhook endpoints over HTTP/2 as well (off by default: HTTP/2 Rapid Reset, CVE-2023-44487).")
	fs.StringVar(&o.clusterName, "cluster-name", "default",
		"Name of this cluster, recorded with every lease so that operators in other clusters sharing the Redis keys can show who holds them.")
	fs.BoolVar(&o.allowGlobalScope, "allow-global-scope", false,
		"Allow DistributedLocks with scope Global (keys shared across namespaces) in every namespace.")
	fs.StringVar(&o.globalScopeLabel, "global-scope-namespace-label", "lockwarden.io/allow-global-scope",
		"Allow scope Global in namespaces that carry this label with the value \"true\". Empty: only --allow-global-scope allows it.")
	fs.StringVar(&o.ownerKeySecret, "owner-key-secret", "",
		"namespace/name of the Secret holding the key owner tokens are derived from; created when missing. Default: lockwarden-owner-key in the manager's namespace.")
	fs.DurationVar(&o.resyncPeriod, "resync-period", controllers.DefaultResyncPeriod,
		"How often every lock's status is refreshed from Redis even without a release notification (a holder in another cluster shows up within it).")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "",
		"Path to a kubeconfig. Default: $KUBECONFIG, then the in-cluster configuration, then ~/.kube/config.")
	fs.BoolVar(&o.enableWebhook, "enable-webhook", true,
		"Serve the Job admission webhook that gates Jobs annotated with lockwarden.io/lock.")
	fs.IntVar(&o.webhookPort, "webhook-port", 9443, "Port the admission webhook listens on.")
	fs.StringVar(&o.webhookHost, "webhook-host", "", "Address the admission webhook listens on. Default: every interface.")
	fs.StringVar(&o.webhookCertDir, "webhook-cert-dir", "/tmp/k8s-webhook-server/serving-certs",
		"Directory of the webhook's serving certificate (tls.crt, tls.key).")
	fs.StringVar(&o.webhookCertMode, "webhook-cert-mode", certModeSelfSigned,
		"self-signed: the manager makes and rotates its own CA and serving certificate, stored in a Secret, and injects the CA into the webhook configuration; external: the certificate is provided in --webhook-cert-dir (cert-manager).")
	fs.StringVar(&o.webhookService, "webhook-service", "",
		"namespace/name of the webhook's Service, for the self-signed certificate's name. Default: lockwarden-webhook-service in the manager's namespace.")
	fs.StringVar(&o.webhookConfigName, "webhook-configuration", "lockwarden-mutating-webhook-configuration",
		"Name of the MutatingWebhookConfiguration the self-signed CA is injected into.")
	o.zap.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: lockwarden takes flags only (see --help)", fs.Args())
	}
	if o.renewDeadline >= o.leaseDuration {
		return nil, fmt.Errorf("--leader-election-renew-deadline (%v) must be shorter than --leader-election-lease-duration (%v)", o.renewDeadline, o.leaseDuration)
	}
	if o.resyncPeriod < time.Second {
		return nil, fmt.Errorf("--resync-period (%v) must be at least 1s", o.resyncPeriod)
	}
	o.namespace = os.Getenv("POD_NAMESPACE")
	if o.namespace == "" {
		o.namespace = o.leaderElectionNS
	}
	if o.namespace == "" {
		o.namespace = defaultNamespace
	}
	if o.ownerKeySecret == "" {
		o.ownerKeySecret = o.namespace + "/lockwarden-owner-key"
	}
	if o.webhookService == "" {
		o.webhookService = o.namespace + "/lockwarden-webhook-service"
	}
	for flagName, v := range map[string]string{"--owner-key-secret": o.ownerKeySecret, "--webhook-service": o.webhookService} {
		if ns, name, ok := strings.Cut(v, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("%s %q must be namespace/name", flagName, v)
		}
	}
	if o.webhookCertMode != certModeSelfSigned && o.webhookCertMode != certModeExternal {
		return nil, fmt.Errorf("--webhook-cert-mode %q must be %q or %q", o.webhookCertMode, certModeSelfSigned, certModeExternal)
	}
	if o.retryPeriod >= o.renewDeadline {
		return nil, fmt.Errorf("--leader-election-retry-period (%v) must be shorter than --leader-election-renew-deadline (%v)", o.retryPeriod, o.renewDeadline)
	}
	return o, nil
}

// minSafeTTL is the shortest lease TTL that outlives a failover of the
// leader: a lease renewed a third of its TTL before the leader died has two
// thirds left, which must cover the election's lease duration, a retry period
// and the new leader's start.
func minSafeTTL(o *options) time.Duration {
	return (o.leaseDuration + 2*o.retryPeriod) * 3 / 2
}

// newManager builds the manager with every controller registered.
func newManager(ctx context.Context, cfg *rest.Config, o *options) (ctrl.Manager, error) {
	var tlsOpts []func(*tls.Config)
	if !o.enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	metricsOpts := metricsserver.Options{
		BindAddress:   o.metricsAddr,
		SecureServing: o.metricsSecure,
		TLSOpts:       tlsOpts,
	}
	if o.metricsSecure {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	leaseDuration, renewDeadline, retryPeriod := o.leaseDuration, o.renewDeadline, o.retryPeriod
	gated, err := labels.NewRequirement(locksv1alpha1.LabelLock, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	certNS, _, _ := strings.Cut(o.webhookService, "/")
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  newScheme(),
		Metrics: metricsOpts,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			// Only gated Jobs are cached: memory does not grow with the cluster's other Jobs.
			&batchv1.Job{}: {Label: labels.NewSelector().Add(*gated)},
			// Only the manager's own Secrets (the webhook certificate) are
			// cached; locks' Secrets are read on demand from their namespace.
			&corev1.Secret{}: {Namespaces: map[string]cache.Config{certNS: {}}},
		}},
		WebhookServer: ctrlwebhook.NewServer(ctrlwebhook.Options{
			Host:    o.webhookHost,
			Port:    o.webhookPort,
			CertDir: o.webhookCertDir,
			TLSOpts: tlsOpts,
		}),
		HealthProbeBindAddress:        o.probeAddr,
		LeaderElection:                o.enableLeaderElection,
		LeaderElectionID:              leaderElectionID,
		LeaderElectionNamespace:       o.leaderElectionNS,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &leaseDuration,
		RenewDeadline:                 &renewDeadline,
		RetryPeriod:                   &retryPeriod,
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	if err := setupControllers(ctx, mgr, o); err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add ready check: %w", err)
	}
	if o.enableWebhook {
		if err := setupWebhook(mgr, o); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// setupWebhook serves the Job admission webhook; with self-signed
// certificates it first waits for the rotator to write them.
func setupWebhook(mgr ctrl.Manager, o *options) error {
	gate := &webhook.JobGate{Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader()}
	if o.webhookCertMode == certModeExternal {
		if err := gate.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("set up the Job webhook: %w", err)
		}
		return mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker())
	}
	ns, name, _ := strings.Cut(o.webhookService, "/")
	ready := make(chan struct{})
	if err := rotator.AddRotator(mgr, &rotator.CertRotator{
		SecretKey:      types.NamespacedName{Namespace: ns, Name: "lockwarden-webhook-server-cert"},
		CertDir:        o.webhookCertDir,
		CAName:         "lockwarden-ca",
		CAOrganization: "lockwarden",
		DNSName:        fmt.Sprintf("%s.%s.svc", name, ns),
		ExtraDNSNames:  []string{fmt.Sprintf("%s.%s.svc.cluster.local", name, ns), "localhost"},
		IsReady:        ready,
		Webhooks:       []rotator.WebhookInfo{{Name: o.webhookConfigName, Type: rotator.Mutating}},
		// Every replica serves the webhook, so every replica keeps its certificate current.
		RequireLeaderElection: false,
	}); err != nil {
		return fmt.Errorf("set up webhook certificate rotation: %w", err)
	}
	// Register the webhook once the certificate exists: the server reads it at start.
	go func() {
		<-ready
		if err := gate.SetupWithManager(mgr); err != nil {
			ctrl.Log.WithName("setup").Error(err, "Setting up the Job webhook failed")
		}
	}()
	return mgr.AddReadyzCheck("webhook-certificate", func(*http.Request) error {
		select {
		case <-ready:
			return mgr.GetWebhookServer().StartedChecker()(nil)
		default:
			return errors.New("the webhook certificate is not ready yet")
		}
	})
}

// setupControllers wires the lock backends, the renewal watchdog and the controllers.
func setupControllers(ctx context.Context, mgr ctrl.Manager, o *options) error {
	log := ctrl.Log.WithName("lockwarden")
	backend.RouteRedisLogs(log.WithName("go-redis"))
	direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	ns, name, _ := strings.Cut(o.ownerKeySecret, "/")
	key, err := holder.LoadOrCreateKey(ctx, direct, types.NamespacedName{Namespace: ns, Name: name})
	if err != nil {
		return err
	}
	tokens, err := holder.NewTokens(key)
	if err != nil {
		return err
	}
	registry := backend.NewRegistry(ctx, mgr.GetAPIReader(), func(cfg redislock.Config) (backend.Locker, error) {
		return redislock.New(cfg, redislock.WithLogger(log.WithName("redis")))
	}, log.WithName("backend"))
	dog := watchdog.New(nil, watchdog.WithLogger(log.WithName("watchdog")))
	if err := mgr.Add(dog); err != nil {
		return fmt.Errorf("add the renewal watchdog: %w", err)
	}
	_, err = controllers.SetupWithManager(ctx, mgr, controllers.Deps{
		Client:      mgr.GetClient(),
		Registry:    registry,
		Watchdog:    dog,
		Tokens:      tokens,
		Recorder:    mgr.GetEventRecorder("lockwarden"),
		ClusterName: o.clusterName,
		Log:         log.WithName("controllers"),
	}, controllers.LockOptions{
		GlobalScope: controllers.GlobalScopePolicy{AllowAll: o.allowGlobalScope, NamespaceLabel: o.globalScopeLabel},
		MinSafeTTL:  minSafeTTL(o),
		Resync:      o.resyncPeriod,
	})
	return err
}

// run builds the manager against cfg and runs it until ctx ends.
func run(ctx context.Context, cfg *rest.Config, o *options) error {
	mgr, err := newManager(ctx, cfg, o)
	if err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("Starting manager", "leaderElection", o.enableLeaderElection, "metricsAddress", o.metricsAddr)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}

// restConfig loads the API server configuration from kubeconfig when given,
// else the way controller-runtime does ($KUBECONFIG, in-cluster, ~/.kube/config).
func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig()
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockwarden:", err)
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockwarden: no Kubernetes configuration (in-cluster, --kubeconfig or $KUBECONFIG):", err)
		os.Exit(1)
	}
	if err := run(ctrl.SetupSignalHandler(), cfg, o); err != nil {
		ctrl.Log.WithName("setup").Error(err, "Manager stopped")
		os.Exit(1)
	}
}
