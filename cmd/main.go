// Command lockwarden is the lockwarden manager: it runs the DistributedLock
// and Job controllers and the admission webhook.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/controllers"
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
	zap                  zap.Options
}

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
	if o.retryPeriod >= o.renewDeadline {
		return nil, fmt.Errorf("--leader-election-retry-period (%v) must be shorter than --leader-election-renew-deadline (%v)", o.retryPeriod, o.renewDeadline)
	}
	return o, nil
}

// newManager builds the manager with every controller registered.
func newManager(cfg *rest.Config, o *options) (ctrl.Manager, error) {
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
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        newScheme(),
		Metrics:                       metricsOpts,
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
	if err := (&controllers.DistributedLockReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up the DistributedLock controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("add ready check: %w", err)
	}
	return mgr, nil
}

// run parses args, builds the manager against cfg and runs it until ctx ends.
func run(ctx context.Context, cfg *rest.Config, o *options) error {
	mgr, err := newManager(cfg, o)
	if err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("Starting manager", "leaderElection", o.enableLeaderElection, "metricsAddress", o.metricsAddr)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
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
	cfg, err := ctrl.GetConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockwarden: no Kubernetes configuration (in-cluster, --kubeconfig or $KUBECONFIG):", err)
		os.Exit(1)
	}
	if err := run(ctrl.SetupSignalHandler(), cfg, o); err != nil {
		ctrl.Log.WithName("setup").Error(err, "Manager stopped")
		os.Exit(1)
	}
}
