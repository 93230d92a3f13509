// Package manager builds the lockwarden manager from its command-line
// flags: the DistributedLock and Job controllers, the renewal watchdog, the
// lock backends with the operator's tenancy policy, and the admission
// webhook. cmd/main.go runs it; tests run exactly the same wiring.
package manager

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
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
	"k8s.io/apimachinery/pkg/util/validation"
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
	kueue "sigs.k8s.io/kueue/apis/kueue/v1beta2"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
	"github.com/lockwarden/lockwarden/internal/backend"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/netguard"
	"github.com/lockwarden/lockwarden/internal/watchdog"
	"github.com/lockwarden/lockwarden/internal/webhook"
)

// leaderElectionID names the coordination.k8s.io Lease the managers elect a leader with.
const leaderElectionID = "lockwarden.locks.lockwarden.io"

// Options are the manager's command-line settings; build them with ParseFlags.
type Options struct {
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
	webhookClientCAFile  string
	webhookClientNames   []string
	// webhookClientCAs are the certificates of --webhook-client-ca-file,
	// read by ParseFlags; nil when it is unset.
	webhookClientCAs     *x509.CertPool
	namespace            string
	kubeconfig           string
	inlineEndpoints      bool
	endpointAllow        []string
	endpointDeny         []string
	denyRefresh          time.Duration
	clusterResourceNS    string
	workers              int
	namespaceQPS         float64
	syncCronJobTemplates bool
	defaultBackend       string
	kubeAPIQPS           float64
	kubeAPIBurst         int
	pprofAddr            string
	kueueAdmissionCheck  string
	// kueue is whether the Kueue admission check runs (resolveKueue).
	kueue bool
	zap   zap.Options
}

// Client-side rate limit of the manager's requests to the API server. A
// manager with tens of thousands of locks writes one request per lock when
// they are created or deleted (the finalizer): client-go's own default (5/s,
// or controller-runtime's 20/s) makes deleting a namespace of 20,000 locks
// take over a quarter of an hour. The API server's priority and fairness
// still protects it.
const (
	DefaultKubeAPIQPS   = 200
	DefaultKubeAPIBurst = 400
)

// ZapOptions are the logging flags.
func (o *Options) ZapOptions() *zap.Options { return &o.zap }

// Kubeconfig is the --kubeconfig flag.
func (o *Options) Kubeconfig() string { return o.kubeconfig }

// Webhook certificate modes.
const (
	certModeSelfSigned = "self-signed"
	certModeExternal   = "external"
)

// DefaultDenyRefresh is how often the addresses of the cluster itself that
// endpoints may not name are read again (--endpoint-deny-refresh).
const DefaultDenyRefresh = time.Minute

// defaultNamespace is where the manager keeps its own objects when neither
// POD_NAMESPACE nor --leader-election-namespace says otherwise.
const defaultNamespace = "lockwarden-system"

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(locksv1alpha1.AddToScheme(s))
	utilruntime.Must(kueue.AddToScheme(s))
	return s
}

// ParseFlags parses args into Options; errors name the flag.
func ParseFlags(args []string) (*Options, error) {
	o := &Options{zap: zap.Options{Development: false}}
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
	fs.StringVar(&o.clusterName, "cluster-name", "",
		"Name of this cluster, recorded with every lease so that operators in other clusters sharing a store can show who holds them, and tell their leases apart. Default: the name recorded in the owner-key Secret; a new installation records cluster- and the start of the kube-system namespace's UID (one installed before that record keeps \"default\").")
	fs.StringVar(&o.defaultBackend, "default-cluster-lock-backend", DefaultClusterLockBackend,
		"Name of the ClusterLockBackend on the kubernetes store (Lease objects in the manager's namespace) that the manager creates when missing, for locks in every namespace, so that a fresh install gates CronJobs with no store to run. It is created once and never changed after; empty: create none.")
	fs.BoolVar(&o.allowGlobalScope, "allow-global-scope", false,
		"Allow DistributedLocks with scope Global (keys shared across namespaces) in every namespace.")
	fs.StringVar(&o.globalScopeLabel, "global-scope-namespace-label", "lockwarden.io/allow-global-scope",
		"Allow scope Global in namespaces that carry this label with the value \"true\". Empty: only --allow-global-scope allows it.")
	fs.StringVar(&o.ownerKeySecret, "owner-key-secret", "",
		"namespace/name of the Secret holding the key owner tokens are derived from; created when missing. Default: lockwarden-owner-key in the manager's namespace.")
	fs.DurationVar(&o.resyncPeriod, "resync-period", controllers.DefaultResyncPeriod,
		"How often every lock's status is refreshed from its store even without a release notification (a holder in another cluster shows up within it).")
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
	fs.StringVar(&o.webhookClientCAFile, "webhook-client-ca-file", "",
		"PEM file of the CA certificates that sign the client certificate the API server presents to the admission webhook (configured on the API server with an AdmissionConfiguration's kubeConfigFile). Set: a caller without a certificate from one of these CAs is refused in the TLS handshake. Read once at start. Empty (default): any caller that reaches the webhook port is served.")
	fs.Func("webhook-client-name",
		"Comma-separated names, one of which the webhook caller's verified client certificate must carry as its common name or as a DNS name (needs --webhook-client-ca-file). Empty (default): any certificate from those CAs.",
		func(v string) error { o.webhookClientNames = append(o.webhookClientNames, splitList(v)...); return nil })
	fs.BoolVar(&o.inlineEndpoints, "inline-endpoints", true,
		"Allow DistributedLocks to name Redis endpoints themselves (spec.backend.redis), within --endpoint-allow and --endpoint-deny. false: locks must name a ClusterLockBackend.")
	fs.Func("endpoint-allow",
		"Comma-separated CIDRs (10.20.0.0/16) and host patterns (redis.infra.svc.cluster.local, *.redis.svc.cluster.local) that endpoints chosen in a namespace (inline, or in a LockBackend) may use; * alone: any address but the denied ones. Empty (default): such endpoints are refused, and locks must name a ClusterLockBackend. A CIDR listed here also lifts the built-in denial of loopback and link-local addresses it covers.",
		func(v string) error { o.endpointAllow = append(o.endpointAllow, splitList(v)...); return nil })
	fs.Func("endpoint-deny",
		"Comma-separated CIDRs or IPs that endpoints chosen in a namespace may never reach, besides the built-in ones: loopback, link-local and cloud metadata addresses, the API server's addresses, and the addresses of the manager's namespace (its pods, the other replicas', its Services').",
		func(v string) error { o.endpointDeny = append(o.endpointDeny, splitList(v)...); return nil })
	fs.DurationVar(&o.denyRefresh, "endpoint-deny-refresh", DefaultDenyRefresh,
		"How often the manager reads again the addresses it denies besides --endpoint-deny: the API server's, and those of the Services and pods of its own namespace.")
	fs.StringVar(&o.clusterResourceNS, "cluster-resource-namespace", "",
		"Namespace the Secrets of ClusterLockBackends are read from. Default: the namespace the manager runs in.")
	fs.IntVar(&o.workers, "max-concurrent-reconciles", controllers.DefaultWorkers,
		"How many DistributedLocks, and how many Jobs, are reconciled at once.")
	fs.BoolVar(&o.syncCronJobTemplates, "sync-cronjob-templates", false,
		"Copy a CronJob's lockwarden.io/lock and lockwarden.io/contention annotations into its job template, so that its Jobs are refused rather than run ungated while the webhook is down. Needs the patch right on CronJobs (config/rbac/cronjob_sync_role.yaml).")
	fs.Float64Var(&o.namespaceQPS, "namespace-reconcile-qps", controllers.DefaultNamespaceQPS,
		"Each namespace's share of the controllers' work: reconciles of its locks and gated Jobs a second (burst ten times that), beyond which they are put back, so that one namespace cannot use the whole --kube-api-qps. Reconciles of held leases and of deletions are not counted. A negative value lifts the bound.")
	fs.Float64Var(&o.kubeAPIQPS, "kube-api-qps", DefaultKubeAPIQPS,
		"Requests per second the manager may send to the API server on average (client-side limit; the API server's priority and fairness applies too). A negative value lifts the client-side limit.")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", DefaultKubeAPIBurst,
		"Requests the manager may send to the API server in a burst above --kube-api-qps.")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "",
		"Address Go's profiler (/debug/pprof) binds to, for example 127.0.0.1:6060. Empty (default): off. It has no authentication: bind it to loopback.")
	bindKueueFlag(fs, o)
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
	if o.denyRefresh < time.Second {
		return nil, fmt.Errorf("--endpoint-deny-refresh (%v) must be at least 1s", o.denyRefresh)
	}
	// The name is a field of every lease's holder record (fields separated
	// by '|') and of workload identities (separated by '/').
	if errs := validation.IsDNS1123Subdomain(o.clusterName); o.clusterName != "" && len(errs) > 0 {
		return nil, fmt.Errorf("--cluster-name %q must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253 characters): %s", o.clusterName, strings.Join(errs, "; "))
	}
	o.namespace = os.Getenv("POD_NAMESPACE")
	if o.namespace == "" {
		o.namespace = o.leaderElectionNS
	}
	if o.namespace == "" {
		o.namespace = defaultNamespace
	}
	if o.clusterResourceNS == "" {
		o.clusterResourceNS = o.namespace
	}
	if o.kubeAPIQPS == 0 {
		return nil, fmt.Errorf("--kube-api-qps must not be 0 (a negative value lifts the limit)")
	}
	if o.kubeAPIBurst < 1 && o.kubeAPIQPS > 0 {
		return nil, fmt.Errorf("--kube-api-burst (%d) must be at least 1", o.kubeAPIBurst)
	}
	if o.workers < 1 {
		return nil, fmt.Errorf("--max-concurrent-reconciles (%d) must be at least 1", o.workers)
	}
	if o.namespaceQPS == 0 {
		return nil, fmt.Errorf("--namespace-reconcile-qps must not be 0 (a negative value lifts the bound)")
	}
	if err := checkDefaultBackendName(o.defaultBackend); err != nil {
		return nil, err
	}
	if err := o.checkKueueFlag(); err != nil {
		return nil, err
	}
	if slices.Contains(o.endpointAllow, AllowAnyEndpoint) && len(o.endpointAllow) > 1 {
		return nil, fmt.Errorf("--endpoint-allow: %s (any address but the denied ones) stands alone; drop it, or the other entries %q", AllowAnyEndpoint, slices.DeleteFunc(slices.Clone(o.endpointAllow), func(s string) bool { return s == AllowAnyEndpoint }))
	}
	if _, err := netguard.NewEndpointPolicy(o.allowList(), o.endpointDeny); err != nil {
		return nil, fmt.Errorf("--endpoint-allow/--endpoint-deny: %w", err)
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
	if len(o.webhookClientNames) > 0 && o.webhookClientCAFile == "" {
		return nil, fmt.Errorf("--webhook-client-name %q needs --webhook-client-ca-file: names are checked only in client certificates verified against those CAs", o.webhookClientNames)
	}
	if o.webhookClientCAFile != "" {
		pool, err := loadClientCAs(o.webhookClientCAFile)
		if err != nil {
			return nil, err
		}
		o.webhookClientCAs = pool
	}
	return o, nil
}

// newWebhookServer is the admission webhook's server, with tlsOpts and the
// client authentication of --webhook-client-ca-file.
func newWebhookServer(o *Options, tlsOpts []func(*tls.Config)) ctrlwebhook.Server {
	opts := slices.Clone(tlsOpts)
	if auth := o.webhookClientAuth(); auth != nil {
		opts = append(opts, auth)
	}
	return ctrlwebhook.NewServer(ctrlwebhook.Options{
		Host:    o.webhookHost,
		Port:    o.webhookPort,
		CertDir: o.webhookCertDir,
		TLSOpts: opts,
	})
}

// loadClientCAs reads the CA certificates of --webhook-client-ca-file.
func loadClientCAs(path string) (*x509.CertPool, error) {
	const want = "a PEM file of the CA certificates (-----BEGIN CERTIFICATE-----) that sign the API server's client certificate for the webhook"
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--webhook-client-ca-file %q cannot be read (%w): it must be %s", path, err, want)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("--webhook-client-ca-file %q holds no PEM certificate: it must be %s", path, want)
	}
	return pool, nil
}

// webhookClientAuth returns the TLS option that makes the webhook server
// require a client certificate signed by --webhook-client-ca-file's CAs
// and, with --webhook-client-name, naming one of those names; nil when
// --webhook-client-ca-file is unset. (controller-runtime's own
// Options.ClientCAName would read the CAs from the serving certificate's
// directory, which the certificate rotator or cert-manager owns.)
func (o *Options) webhookClientAuth() func(*tls.Config) {
	if o.webhookClientCAs == nil {
		return nil
	}
	pool, names := o.webhookClientCAs, slices.Clone(o.webhookClientNames)
	return func(c *tls.Config) {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = pool
		if len(names) == 0 {
			return
		}
		// Runs after the chain was verified against pool.
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
				return errors.New("no verified client certificate")
			}
			leaf := cs.VerifiedChains[0][0]
			if slices.Contains(names, leaf.Subject.CommonName) || slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return slices.Contains(names, n) }) {
				return nil
			}
			return fmt.Errorf("client certificate %q (DNS names %q) names none of --webhook-client-name %q", leaf.Subject.CommonName, leaf.DNSNames, names)
		}
	}
}

// minSafeTTL is the shortest lease TTL that outlives a failover of the
// leader: a lease renewed a third of its TTL before the leader died has two
// thirds left, which must cover the election's lease duration, a retry period
// and the new leader's start.
func minSafeTTL(o *Options) time.Duration {
	return (o.leaseDuration + 2*o.retryPeriod) * 3 / 2
}

// New builds the manager with every controller registered.
func New(ctx context.Context, cfg *rest.Config, o *Options) (ctrl.Manager, error) {
	cfg = withRateLimit(cfg, o)
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
	if err := o.resolveKueue(cfg); err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  newScheme(),
		Metrics: metricsOpts,
		Cache: cache.Options{
			// managedFields are never read here, and a lock's are about as
			// large as the rest of it: at tens of thousands of locks they
			// would be most of the cache. An update of a cached object
			// without them leaves them as they are.
			DefaultTransform: cache.TransformStripManagedFields(),
			ByObject: o.kueueCache(map[client.Object]cache.ByObject{
				// Only gated Jobs are cached, without their pod templates'
				// specs: memory does not grow with the cluster's other Jobs,
				// nor with the size of a tenant's.
				&batchv1.Job{}: {Label: labels.NewSelector().Add(*gated), Transform: controllers.LeanJob},
				// Likewise only gated Pods (the Pod webhook labels them).
				&corev1.Pod{}: {Label: labels.NewSelector().Add(*gated)},
				// Only the manager's own Secrets (the webhook certificate) are
				// cached; locks' Secrets are read on demand from their namespace.
				&corev1.Secret{}: {Namespaces: map[string]cache.Config{certNS: {}}},
			})},
		WebhookServer:                 newWebhookServer(o, tlsOpts),
		HealthProbeBindAddress:        o.probeAddr,
		PprofBindAddress:              o.pprofAddr,
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
	registry, tokens, err := setupControllers(ctx, mgr, o)
	if err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add ready check: %w", err)
	}
	if o.enableWebhook {
		if err := setupWebhook(mgr, o, registry, tokens); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// withRateLimit returns a copy of cfg with the client-side rate limit of
// --kube-api-qps and --kube-api-burst, which replaces whatever the
// configuration's loader set (controller-runtime sets 20 and 30, a
// kubeconfig file nothing, which client-go takes for 5 and 10).
func withRateLimit(cfg *rest.Config, o *Options) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = float32(o.kubeAPIQPS), o.kubeAPIBurst
	cfg.RateLimiter = nil
	return cfg
}

// setupWebhook serves the admission webhooks (the Job gate, the
// force-release audit and the check of a lock's recurring holds); with self-signed
// certificates it first waits for the rotator to write them.
func setupWebhook(mgr ctrl.Manager, o *Options, registry *backend.Registry, tokens *holder.Tokens) error {
	gate := &webhook.JobGate{Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Check: registry.Check, Kueue: o.kueue}
	podGate := &webhook.PodGate{Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Check: registry.Check}
	workloads := &webhook.WorkloadGate{Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader()}
	audit := &webhook.ForceReleaseAudit{Seal: tokens.ForceReleaseSeal}
	lockSpec := &webhook.LockSpecCheck{}
	if o.webhookCertMode == certModeExternal {
		if err := gate.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("set up the Job webhook: %w", err)
		}
		if err := podGate.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("set up the Pod webhook: %w", err)
		}
		workloads.SetupWithManager(mgr)
		audit.SetupWithManager(mgr)
		lockSpec.SetupWithManager(mgr)
		return mgr.AddReadyzCheck("webhook", webhookStarted(mgr.GetWebhookServer(), o))
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
		if err := podGate.SetupWithManager(mgr); err != nil {
			ctrl.Log.WithName("setup").Error(err, "Setting up the Pod webhook failed")
		}
		workloads.SetupWithManager(mgr)
		audit.SetupWithManager(mgr)
		lockSpec.SetupWithManager(mgr)
	}()
	return mgr.AddReadyzCheck("webhook-certificate", func(*http.Request) error {
		select {
		case <-ready:
			return webhookStarted(mgr.GetWebhookServer(), o)(nil)
		default:
			return errors.New("the webhook certificate is not ready yet")
		}
	})
}

// webhookStarted is the readiness check of the webhook server srv: it is
// listening. Without client authentication that is controller-runtime's
// StartedChecker, a TLS handshake with the server. That handshake has no
// client certificate to present: with client authentication it passes only
// because under TLS 1.3 the client completes its side of the handshake
// before the server refuses it, racing the server's refusal when it closes
// the connection, and it would fail under TLS 1.2. So with client
// authentication the check is a TCP connection to the webhook port instead;
// the server loads its certificate before it listens.
func webhookStarted(srv ctrlwebhook.Server, o *Options) healthz.Checker {
	if o.webhookClientCAs == nil {
		return srv.StartedChecker()
	}
	addr := net.JoinHostPort(o.webhookHost, fmt.Sprint(o.webhookPort))
	return func(req *http.Request) error {
		ctx := context.Background()
		if req != nil {
			ctx = req.Context()
		}
		d := net.Dialer{Timeout: 10 * time.Second}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("webhook server is not reachable: %w", err)
		}
		return conn.Close()
	}
}

// setupControllers wires the lock backends, the renewal watchdog and the
// controllers; the webhook shares the returned registry's policy and seals
// force-release requests with the returned tokens' key.
func setupControllers(ctx context.Context, mgr ctrl.Manager, o *Options) (*backend.Registry, *holder.Tokens, error) {
	log := ctrl.Log.WithName("lockwarden")
	backend.RouteRedisLogs(log.WithName("go-redis"))
	direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return nil, nil, fmt.Errorf("create client: %w", err)
	}
	ns, name, _ := strings.Cut(o.ownerKeySecret, "/")
	id, err := holder.LoadOrCreateIdentity(ctx, direct, types.NamespacedName{Namespace: ns, Name: name}, func(ctx context.Context) (string, error) {
		if o.clusterName != "" {
			return o.clusterName, nil
		}
		return clusterNameFromUID(ctx, direct)
	})
	if err != nil {
		return nil, nil, err
	}
	if o.clusterName == "" {
		if errs := validation.IsDNS1123Subdomain(id.Cluster); len(errs) > 0 {
			return nil, nil, fmt.Errorf("the owner-key Secret %s records the cluster name %q (key %s), which is not a DNS-1123 subdomain: %s; fix the key or set --cluster-name", o.ownerKeySecret, id.Cluster, holder.ClusterField, strings.Join(errs, "; "))
		}
		o.clusterName = id.Cluster
	}
	log.Info("Cluster name recorded with every lease", "name", o.clusterName)
	tokens, err := holder.NewTokens(id.Key)
	if err != nil {
		return nil, nil, err
	}
	registry := backend.NewRegistry(ctx, mgr.GetAPIReader(), backend.NewLocker(log), log.WithName("backend"))
	policy, err := endpointPolicy(ctx, direct, mgr, o, log.WithName("endpoint-policy"))
	if err != nil {
		return nil, nil, err
	}
	registry.SetPolicy(o.BackendPolicy(policy), mgr.GetClient())
	// A Pod's hostname is its name.
	podName, _ := os.Hostname()
	registry.SetCluster(backend.Cluster{Config: mgr.GetConfig(), Namespace: o.namespace, Identity: podName})
	if o.defaultBackend != "" {
		if err := mgr.Add(&defaultBackend{c: direct, name: o.defaultBackend, log: log.WithName("default-backend")}); err != nil {
			return nil, nil, fmt.Errorf("add the default ClusterLockBackend: %w", err)
		}
	}
	dog := watchdog.New(nil, watchdog.WithLogger(log.WithName("watchdog")))
	if err := mgr.Add(dog); err != nil {
		return nil, nil, fmt.Errorf("add the renewal watchdog: %w", err)
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
		MinSafeTTL:           minSafeTTL(o),
		Resync:               o.resyncPeriod,
		Workers:              o.workers,
		NamespaceQPS:         o.namespaceQPS,
		SyncCronJobTemplates: o.syncCronJobTemplates,
		KueueAdmissionCheck:  o.kueue,
	})
	return registry, tokens, err
}

// BackendPolicy is the policy the flags give the backend registry, with
// endpoints the endpoint policy built from them (endpointPolicy).
func (o *Options) BackendPolicy(endpoints *netguard.EndpointPolicy) backend.Policy {
	return backend.Policy{
		InlineDisabled:           !o.inlineEndpoints,
		InlineNeedsAllowList:     o.inlineEndpoints && len(o.endpointAllow) == 0,
		Endpoints:                endpoints,
		GlobalScope:              backend.GlobalScopePolicy{AllowAll: o.allowGlobalScope, NamespaceLabel: o.globalScopeLabel},
		ClusterResourceNamespace: o.clusterResourceNS,
	}
}

// FlagEndpointPolicy is the endpoint policy of --endpoint-allow and
// --endpoint-deny alone, without the addresses the manager denies when it
// starts (the API server's, its own pod IP's).
func (o *Options) FlagEndpointPolicy() (*netguard.EndpointPolicy, error) {
	return netguard.NewEndpointPolicy(o.allowList(), o.endpointDeny)
}

// AllowAnyEndpoint, as the whole of --endpoint-allow, allows endpoints
// chosen in a namespace to use any address but the denied ones.
const AllowAnyEndpoint = "*"

// allowList is the allow-list the endpoint policy gets: nil (anywhere but
// the denied addresses) for AllowAnyEndpoint.
func (o *Options) allowList() []string {
	if slices.Equal(o.endpointAllow, []string{AllowAnyEndpoint}) {
		return nil
	}
	return o.endpointAllow
}

// splitList splits a comma-separated flag value, dropping empty entries.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Run builds the manager against cfg and runs it until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, o *Options) error {
	mgr, err := New(ctx, cfg, o)
	if err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("Starting manager", "leaderElection", o.enableLeaderElection, "metricsAddress", o.metricsAddr)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}

// RestConfig loads the API server configuration from kubeconfig when given,
// else the way controller-runtime does ($KUBECONFIG, in-cluster, ~/.kube/config).
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig()
}
