// Package devcluster runs a throw-away Kubernetes control plane, Redis and the
// lockwarden operator on this machine, as child processes, without Docker:
// etcd, kube-apiserver, kube-controller-manager (so CronJobs really create
// Jobs and Jobs Pods), kube-scheduler, kwok (a simulated node that "runs"
// Pods: they become Running, then Succeeded after a delay), one or more
// redis-server masters, optionally another lock store (Options.Store:
// PostgreSQL, ZooKeeper or etcd; see StartStore) and the operator binary.
// `make dev` and the end-to-end suite (test/e2e) both use it.
//
// The operator runs as its ServiceAccount's user with the RBAC that
// config/default installs, and the API server enforces config/default's
// ValidatingAdmissionPolicy (see installProductionObjects): what the operator
// may do here is what it may do in a real install.
//
// Every process listens on 127.0.0.1 on a free port (Redis on a preferred
// port when it is free; the API server on its own loopback address,
// APIServerHost), keeps its state under Options.Dir and writes its
// output to <Dir>/logs/<name>.log. A process counts as started only while it
// runs and owns a listening socket on each port it was given (Redis: INFO's
// process_id is its PID); when it exits because another process took one of
// its ports, it is started again on other ports. Every child dies with its
// parent: they get SIGKILL when it exits (Pdeathsig), and Stop ends them in order.
package devcluster

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/internal/testutil/freeport"
)

const (
	// OperatorNamespace is the namespace the operator runs in (POD_NAMESPACE):
	// its owner key Secret and leader election Lease live there.
	OperatorNamespace = "lockwarden-system"
	// OperatorServiceAccount is the operator's ServiceAccount, as
	// config/default names it.
	OperatorServiceAccount = "lockwarden-controller-manager"
	// OperatorUser is the user the operator runs as: its ServiceAccount's
	// username, which config/default's RoleBindings and the job-gate
	// ValidatingAdmissionPolicy name.
	OperatorUser = "system:serviceaccount:" + OperatorNamespace + ":" + OperatorServiceAccount
	// DevRedisBackend is the ClusterLockBackend the cluster creates for its
	// first Redis master, selecting every namespace.
	DevRedisBackend = "dev-redis"
	// APIServerHost is the loopback address the API server listens on: an
	// address of its own, as in a real cluster, not 127.0.0.1 where Redis
	// listens. The operator denies inline endpoints on the API server's
	// addresses (any port) unless --endpoint-allow names that very address;
	// the operator's --endpoint-allow=127.0.0.1/32 would do so if the API
	// server shared 127.0.0.1, and inline locks could then aim the operator
	// at the API server. Here that denial stays in force.
	APIServerHost = "127.0.0.10"
	// NodeName is the simulated node kwok manages.
	NodeName = "kwok-node-0"
	// WebhookConfigurationName is the MutatingWebhookConfiguration installed
	// from config/webhook, pointed at the operator's local port. It is not
	// named as config/default names its own (lockwarden-mutating-webhook-configuration),
	// so that config/default can be applied to the cluster next to it.
	WebhookConfigurationName = "lockwarden-dev-mutating-webhook-configuration"
	// ClusterName is the operator's --cluster-name.
	ClusterName = "dev"

	// serviceIP is the first address of the service range, the kubernetes Service's.
	serviceIP          = "10.96.0.1"
	serviceClusterCIDR = "10.96.0.0/16"
	podCIDR            = "10.244.0.0/16"

	// startTimeout bounds each component's wait for readiness.
	startTimeout = 90 * time.Second
	// portAttempts is how many sets of ports a component tries when another
	// process keeps taking one of them.
	portAttempts = 5
)

// controllers are the kube-controller-manager controllers the cluster runs:
// enough for CronJobs, Jobs, Deployments (with their ReplicaSets),
// StatefulSets, garbage collection and service accounts.
var controllers = []string{
	"cronjob-controller", "job-controller", "deployment-controller", "replicaset-controller", "statefulset-controller",
	"garbage-collector-controller", "namespace-controller",
	"serviceaccount-controller", "serviceaccount-token-controller", "root-ca-certificate-publisher-controller",
	"ttl-after-finished-controller", "pod-garbage-collector-controller", "clusterrole-aggregation-controller",
}

// Options configure a cluster. The zero value works from inside the checkout
// once the binaries are cached and bin/lockwarden is built.
type Options struct {
	// Dir holds the cluster's state; it is emptied at start. Default: <Root>/.dev.
	Dir string
	// Root is the lockwarden checkout (config/crd, config/webhook). Default:
	// the nearest directory above the working directory with lockwarden's go.mod.
	Root string
	// Assets is the directory of kube-apiserver, etcd, kube-controller-manager,
	// kube-scheduler, kwok and kwok-stages/. Default: $KUBEBUILDER_ASSETS when
	// it holds them, else what `hack/control-plane.sh --e2e` prints.
	Assets string
	// Manager is the operator binary. Default: <Root>/bin/lockwarden.
	Manager string
	// RedisServer is the redis-server binary. Default: $LOCKWARDEN_REDIS_SERVER, else redis-server on PATH.
	RedisServer string
	// RedisPorts lists one preferred port per Redis master; 0, or a port in
	// use, means a free port. Default: one master on any free port.
	RedisPorts []int
	// ExternalRedis lists the addresses of Redis masters that run already
	// (another cluster's: see Cluster.RedisAddrs) for this cluster to use
	// instead of starting its own: two clusters that share a store, as two
	// clusters of one fleet do. The ClusterLockBackend DevRedisBackend points
	// at the first. The cluster neither stops nor restarts them, and
	// RedisPorts and RedisServer are not used.
	ExternalRedis []string
	// ClusterName is the operator's --cluster-name, which its holders'
	// identities carry. Default: ClusterName. Two clusters that share a
	// store need distinct names.
	ClusterName string
	// Store is the lock store the ClusterLockBackend DevBackend points at,
	// one of StoreKinds: "redis" (default: the first Redis master),
	// "postgres", "zookeeper" or "etcd" (a server the cluster starts on
	// loopback beside Redis, which always runs; see StartStore).
	Store string
	// LeaderElect runs the operator with --leader-elect.
	LeaderElect bool
	// ManagerArgs are extra flags for the operator, after the ones devcluster sets.
	ManagerArgs []string
	// Logf reports progress. Default: nothing.
	Logf func(format string, args ...any)
}

// Redis is one redis-server master.
type Redis struct {
	// Addr is 127.0.0.1:<port>, the same across restarts.
	Addr string
	// Port is the port it listens on.
	Port int
	// LogPath is its log file.
	LogPath string

	proc *process
	dir  string
}

// Cluster is a running local cluster.
type Cluster struct {
	// Dir is the state directory.
	Dir string
	// Kubeconfig is the path of a kubeconfig for the admin user (system:masters).
	Kubeconfig string
	// OperatorKubeconfig is the path of the operator's kubeconfig: OperatorUser.
	OperatorKubeconfig string
	// Config reaches the API server as the admin user.
	Config *rest.Config
	// Client is an uncached client with lockwarden's API in its scheme.
	Client client.Client
	// Assets is the directory of the control-plane binaries (kubectl too, when cached).
	Assets string
	// Root is the lockwarden checkout.
	Root string
	// APIServerURL is https://<APIServerHost>:<port>.
	APIServerURL string
	// Redis lists the Redis masters, in the order of Options.RedisPorts.
	Redis []*Redis
	// Store is the store Options.Store chose, which the ClusterLockBackend
	// DevBackend points at.
	Store *Store
	// MetricsURL is the operator's Prometheus endpoint (plain HTTP).
	MetricsURL string
	// ProbeURL is the base of the operator's /healthz and /readyz.
	ProbeURL string
	// WebhookURL is where the API server calls the operator's webhooks
	// (https://host:port; each webhook's path follows).
	WebhookURL string

	opts   Options
	pki    *pki
	logDir string
	ports  ports
	// httpClient trusts the cluster's CA.
	httpClient *http.Client

	etcd, apiserver, kcm, scheduler, kwok, operator *process

	lock     *os.File
	stopOnce sync.Once

	storesMu   sync.Mutex
	stores     []*Store // started by StartStore, stopped by Stop
	storeCount int

	portsMu sync.Mutex
	// held are the ports handed out to this cluster, given back on Stop.
	held []int
}

type ports struct {
	etcd, etcdPeer, apiserver, kcm, scheduler, webhook, metrics, probe int
}

func (o *Options) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

// Start starts a cluster and returns when every part of it is ready: the API
// server answers, CRDs are established, config/default's RBAC is installed
// and its ValidatingAdmissionPolicy in effect, the node is Ready, the default
// ServiceAccount exists, Redis (and the store Options.Store chose) answers,
// the ClusterLockBackends DevRedisBackend and DevBackend exist and the operator is ready (its webhook serving). On error,
// everything started is stopped again.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, Dir: opts.Dir, Root: opts.Root, Assets: opts.Assets, logDir: filepath.Join(opts.Dir, "logs")}
	if err := c.prepareDir(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

func (o *Options) defaults() error {
	if o.Root == "" {
		root, err := FindRoot()
		if err != nil {
			return err
		}
		o.Root = root
	}
	if o.Dir == "" {
		o.Dir = filepath.Join(o.Root, ".dev")
	}
	abs, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	o.Dir = abs
	if o.Assets == "" {
		assets, err := FindAssets(o.Root)
		if err != nil {
			return err
		}
		o.Assets = assets
	}
	if o.Manager == "" {
		o.Manager = filepath.Join(o.Root, "bin", "lockwarden")
	}
	if _, err := os.Stat(o.Manager); err != nil {
		return fmt.Errorf("the operator binary %s is missing (go build -o bin/lockwarden ./cmd): %w", o.Manager, err)
	}
	if o.ClusterName == "" {
		o.ClusterName = ClusterName
	}
	if o.Store == "" {
		o.Store = StoreRedis
	}
	if len(o.ExternalRedis) > 0 {
		return ValidateStore(o.Store)
	}
	if o.RedisServer == "" {
		o.RedisServer = os.Getenv("LOCKWARDEN_REDIS_SERVER")
	}
	if o.RedisServer == "" {
		p, err := exec.LookPath("redis-server")
		if err != nil {
			return errors.New("redis-server is not on PATH: run hack/ensure-redis.sh (make redis-server) or set LOCKWARDEN_REDIS_SERVER")
		}
		o.RedisServer = p
	}
	if len(o.RedisPorts) == 0 {
		o.RedisPorts = []int{0}
	}
	return ValidateStore(o.Store)
}

// FindRoot returns the nearest directory at or above the working directory
// whose go.mod declares lockwarden's module.
func FindRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				if strings.TrimSpace(line) == "module github.com/lockwarden/lockwarden" {
					return dir, nil
				}
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the lockwarden checkout (no go.mod of github.com/lockwarden/lockwarden above the working directory)")
		}
		dir = parent
	}
}

// assetBinaries are the binaries a cluster needs from the assets directory.
var assetBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}

// FindAssets returns $KUBEBUILDER_ASSETS when it holds every binary a
// cluster needs, else the directory `hack/control-plane.sh --e2e` prints
// (which builds and caches the binaries when they are missing).
func FindAssets(root string) (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" && hasAssets(dir) {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(root, "hack", "control-plane.sh"), "--e2e")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/control-plane.sh --e2e: %w", err)
	}
	dir := strings.TrimSpace(string(out))
	if !hasAssets(dir) {
		return "", fmt.Errorf("hack/control-plane.sh --e2e printed %q, which lacks some of %v or kwok-stages/", dir, assetBinaries)
	}
	return dir, nil
}

// hasAssets reports whether dir holds the cluster's binaries and kwok's Stages.
// dir is the developer's own $KUBEBUILDER_ASSETS or cache directory.
func hasAssets(dir string) bool {
	for _, b := range assetBinaries {
		fi, err := os.Stat(filepath.Join(dir, b)) //nolint:gosec // G703: a directory the developer chose, only stat'ed
		if err != nil || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	_, err := os.Stat(filepath.Join(dir, "kwok-stages", "pod", "general")) //nolint:gosec // G703: as above
	return err == nil
}

// prepareDir locks the state directory against a second cluster and empties it.
func (c *Cluster) prepareDir() error {
	if err := os.MkdirAll(c.Dir, 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(c.Dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return fmt.Errorf("another cluster is running in %s (its lock file is held): stop it first", c.Dir)
	}
	c.lock = f
	entries, err := os.ReadDir(c.Dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == "lock" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(c.Dir, e.Name())); err != nil {
			return err
		}
	}
	for _, d := range []string{c.logDir, filepath.Join(c.Dir, "pki"), filepath.Join(c.Dir, "etcd"), filepath.Join(c.Dir, "kwok")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) start(ctx context.Context) error {
	begin := time.Now()
	var err error
	if c.pki, err = writePKI(filepath.Join(c.Dir, "pki")); err != nil {
		return fmt.Errorf("write certificates: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.caPEM)
	c.httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}

	// Redis and etcd first, in parallel.
	redisDone := make(chan struct{})
	var redisErr error
	go func() {
		defer close(redisDone)
		redisErr = c.startRedis(ctx)
	}()
	// Whatever fails below, Stop must not run while Redis is still starting.
	defer func() { <-redisDone }()
	// The store the ClusterLockBackend DevBackend points at, when not Redis, too.
	storeDone := make(chan struct{})
	var storeErr error
	go func() {
		defer close(storeDone)
		if c.opts.Store != StoreRedis {
			c.Store, storeErr = c.StartStore(ctx, c.opts.Store)
		}
	}()
	defer func() { <-storeDone }()
	err = c.onFreePorts("etcd", nil, 2, func(p []int) error {
		c.ports.etcd, c.ports.etcdPeer = p[0], p[1]
		return c.startEtcd(ctx)
	})
	if err != nil {
		return err
	}
	c.opts.logf("etcd ready (%s)", since(begin))
	err = c.onFreePorts("kube-apiserver", nil, 1, func(p []int) error {
		c.ports.apiserver = p[0]
		c.APIServerURL = "https://" + net.JoinHostPort(APIServerHost, strconv.Itoa(p[0]))
		return c.startAPIServer(ctx)
	})
	if err != nil {
		return err
	}
	c.opts.logf("kube-apiserver ready at %s (%s)", c.APIServerURL, since(begin))
	if err := c.writeKubeconfig(); err != nil {
		return err
	}

	// The rest of the control plane and the cluster objects, in parallel.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	steps := []func() error{
		func() error {
			return c.onFreePorts("kube-controller-manager", nil, 1, func(p []int) error {
				c.ports.kcm = p[0]
				return c.startControllerManager(ctx)
			})
		},
		func() error {
			return c.onFreePorts("kube-scheduler", nil, 1, func(p []int) error {
				c.ports.scheduler = p[0]
				return c.startScheduler(ctx)
			})
		},
		func() error { return c.startKwok(ctx) },
		func() error { return c.installObjects(ctx) },
	}
	for i, step := range steps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = step()
		}()
	}
	<-redisDone
	if redisErr != nil {
		wg.Wait()
		return redisErr
	}
	c.opts.logf("Redis ready: %s (%s)", strings.Join(c.RedisAddrs(), ", "), since(begin))
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.opts.logf("control plane ready: controller manager, scheduler, kwok node %s, CRDs, RBAC and admission policy of config/default (%s)", NodeName, since(begin))
	if err := c.applyDevRedisBackend(ctx); err != nil {
		return err
	}
	<-storeDone
	if storeErr != nil {
		return storeErr
	}
	if c.Store == nil {
		if c.Store, err = c.StartStore(ctx, StoreRedis); err != nil {
			return err
		}
	}
	if err := c.ApplyBackend(ctx, DevBackend, c.Store); err != nil {
		return err
	}
	// The webhook configuration points at the operator's port, so it is
	// written (again) whenever the operator moves to other ports.
	err = c.onFreePorts("lockwarden", nil, 3, func(p []int) error {
		c.ports.webhook, c.ports.metrics, c.ports.probe = p[0], p[1], p[2]
		c.MetricsURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", c.ports.metrics)
		c.ProbeURL = fmt.Sprintf("http://127.0.0.1:%d", c.ports.probe)
		c.WebhookURL = fmt.Sprintf("https://127.0.0.1:%d", c.ports.webhook)
		if err := c.applyWebhookConfiguration(ctx); err != nil {
			return err
		}
		c.operator = nil // its flags name the ports
		return c.StartOperator(ctx)
	})
	if err != nil {
		return err
	}
	c.opts.logf("operator ready (%s)", since(begin))
	return nil
}

func since(t time.Time) string { return time.Since(t).Round(100 * time.Millisecond).String() }

// onFreePorts calls start with n ports (first, when given, on the first
// attempt; then ports from freeport) until it does not fail because another
// process took one of them. start sets the ports where the cluster keeps them
// and starts and waits for the component, which has exited when start
// reports errPortTaken.
func (c *Cluster) onFreePorts(what string, first []int, n int, start func(ports []int) error) error {
	var errs []error
	for attempt := range portAttempts {
		ports := first
		if attempt > 0 || len(first) != n {
			var err error
			if ports, err = freeport.TakeN(n); err != nil {
				return err
			}
		}
		c.holdPorts(ports...)
		err := start(ports)
		if err == nil || !errors.Is(err, errPortTaken) {
			return err
		}
		errs = append(errs, err)
		c.opts.logf("%s: another process took one of ports %v; trying other ports", what, ports)
	}
	return fmt.Errorf("%s: %d sets of ports were taken by other processes: %w", what, portAttempts, errors.Join(errs...))
}

// holdPorts records ports handed out to this cluster, to give back on Stop.
func (c *Cluster) holdPorts(ports ...int) {
	c.portsMu.Lock()
	defer c.portsMu.Unlock()
	c.held = append(c.held, ports...)
}

// newProcess makes a process that counts as started once it listens on ports.
func (c *Cluster) newProcess(name, binary string, args []string, ports []int, env ...string) *process {
	return &process{name: name, path: binary, args: args, env: env, ports: ports, logPath: filepath.Join(c.logDir, name+".log")}
}

func (c *Cluster) asset(name string) string { return filepath.Join(c.Assets, name) }

func (c *Cluster) startEtcd(ctx context.Context) error {
	client := fmt.Sprintf("http://127.0.0.1:%d", c.ports.etcd)
	peer := fmt.Sprintf("http://127.0.0.1:%d", c.ports.etcdPeer)
	c.etcd = c.newProcess("etcd", c.asset("etcd"), []string{
		"--name=default",
		"--data-dir=" + filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=default=" + peer,
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	}, []int{c.ports.etcd, c.ports.etcdPeer})
	if err := c.etcd.start(); err != nil {
		return err
	}
	return c.waitHTTP(ctx, c.etcd, client+"/health", "", func(body string) bool { return strings.Contains(body, `"health":"true"`) })
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	c.apiserver = c.newProcess("kube-apiserver", c.asset("kube-apiserver"), []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", c.ports.etcd),
		"--bind-address=" + APIServerHost,
		fmt.Sprintf("--secure-port=%d", c.ports.apiserver),
		"--cert-dir=" + filepath.Join(c.Dir, "pki"),
		"--tls-cert-file=" + c.pki.servingCrt,
		"--tls-private-key-file=" + c.pki.servingKey,
		"--client-ca-file=" + c.pki.caCert,
		"--token-auth-file=" + c.pki.tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + c.pki.saPub,
		"--service-account-signing-key-file=" + c.pki.saKey,
		"--service-cluster-ip-range=" + serviceClusterCIDR,
		"--allow-privileged=true",
		// No node lifecycle controller runs, so nothing would remove the
		// not-ready taint this plugin puts on new nodes.
		"--disable-admission-plugins=TaintNodesByCondition",
		"--profiling=false",
	}, []int{c.ports.apiserver})
	if err := c.apiserver.start(); err != nil {
		return err
	}
	return c.waitHTTP(ctx, c.apiserver, c.APIServerURL+"/readyz", c.pki.adminToken, func(body string) bool { return body == "ok" })
}

func (c *Cluster) writeKubeconfig() error {
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lockwarden-dev"] = &clientcmdapi.Cluster{Server: c.APIServerURL, CertificateAuthorityData: c.pki.caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: c.pki.adminToken}
	cfg.Contexts["lockwarden-dev"] = &clientcmdapi.Context{Cluster: "lockwarden-dev", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "lockwarden-dev"
	if err := clientcmd.WriteToFile(*cfg, c.Kubeconfig); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	c.OperatorKubeconfig = filepath.Join(c.Dir, "operator.kubeconfig")
	op := clientcmdapi.NewConfig()
	op.Clusters["lockwarden-dev"] = cfg.Clusters["lockwarden-dev"]
	op.AuthInfos[OperatorServiceAccount] = &clientcmdapi.AuthInfo{Token: c.pki.operatorToken}
	op.Contexts["lockwarden-dev"] = &clientcmdapi.Context{Cluster: "lockwarden-dev", AuthInfo: OperatorServiceAccount, Namespace: OperatorNamespace}
	op.CurrentContext = "lockwarden-dev"
	if err := clientcmd.WriteToFile(*op, c.OperatorKubeconfig); err != nil {
		return fmt.Errorf("write the operator's kubeconfig: %w", err)
	}
	c.Config = &rest.Config{
		Host:            c.APIServerURL,
		BearerToken:     c.pki.adminToken,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.caPEM},
		QPS:             50,
		Burst:           100,
	}
	cl, err := client.New(c.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		return err
	}
	c.Client = cl
	return nil
}

// componentArgs are the flags kube-controller-manager and kube-scheduler
// share. They serve /healthz (always allowed) with the cluster's certificate;
// without delegated authentication, nothing else.
func (c *Cluster) componentArgs(port int) []string {
	return []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--tls-cert-file=" + c.pki.servingCrt,
		"--tls-private-key-file=" + c.pki.servingKey,
		"--leader-elect=false",
	}
}

func (c *Cluster) startControllerManager(ctx context.Context) error {
	args := append(c.componentArgs(c.ports.kcm),
		"--controllers="+strings.Join(controllers, ","),
		"--service-account-private-key-file="+c.pki.saKey,
		"--root-ca-file="+c.pki.caCert,
		"--use-service-account-credentials=false",
		"--cluster-cidr="+podCIDR,
		"--service-cluster-ip-range="+serviceClusterCIDR,
		// A Job's Pods are created right away, not after the default batching.
		"--concurrent-job-syncs=5",
	)
	c.kcm = c.newProcess("kube-controller-manager", c.asset("kube-controller-manager"), args, []int{c.ports.kcm})
	if err := c.kcm.start(); err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, c.kcm, fmt.Sprintf("https://127.0.0.1:%d/healthz", c.ports.kcm), "", func(body string) bool { return body == "ok" }); err != nil {
		return err
	}
	// Pods need the namespace's default ServiceAccount, which the controller manager creates.
	return c.waitFor(ctx, c.kcm, "the default ServiceAccount", func(ctx context.Context) (bool, error) {
		return defaultServiceAccountExists(ctx, c.Client)
	})
}

func (c *Cluster) startScheduler(ctx context.Context) error {
	c.scheduler = c.newProcess("kube-scheduler", c.asset("kube-scheduler"), c.componentArgs(c.ports.scheduler), []int{c.ports.scheduler})
	if err := c.scheduler.start(); err != nil {
		return err
	}
	return c.waitHTTP(ctx, c.scheduler, fmt.Sprintf("https://127.0.0.1:%d/healthz", c.ports.scheduler), "", func(body string) bool { return body == "ok" })
}

func (c *Cluster) startKwok(ctx context.Context) error {
	stages, err := writeKwokStages(c.Assets, filepath.Join(c.Dir, "kwok", "stages.yaml"))
	if err != nil {
		return err
	}
	c.kwok = c.newProcess("kwok", c.asset("kwok"), []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--config=" + stages,
		"--manage-all-nodes=false",
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--cidr=" + podCIDR,
		"--node-ip=127.0.0.1",
	}, nil) // kwok serves no port here; the node it makes Ready shows it works
	if err := c.kwok.start(); err != nil {
		return err
	}
	if err := createNode(ctx, c.Client); err != nil {
		return err
	}
	return c.waitFor(ctx, c.kwok, "node "+NodeName+" Ready", func(ctx context.Context) (bool, error) {
		return nodeReady(ctx, c.Client)
	})
}

// StartOperator starts the operator (when it is not running) on its ports and
// waits until it is ready and listening on them. It fails when another
// process took one of its ports while it was down. The operator runs as
// OperatorUser (OperatorKubeconfig).
func (c *Cluster) StartOperator(ctx context.Context) error {
	args := []string{
		"--leader-elect=" + strconv.FormatBool(c.opts.LeaderElect),
		"--leader-election-namespace=" + OperatorNamespace,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", c.ports.metrics),
		"--metrics-secure=false",
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", c.ports.probe),
		"--enable-webhook=true",
		"--webhook-cert-mode=external",
		"--webhook-cert-dir=" + c.pki.webhookDir,
		fmt.Sprintf("--webhook-port=%d", c.ports.webhook),
		"--webhook-host=127.0.0.1",
		"--webhook-configuration=" + WebhookConfigurationName,
		"--cluster-name=" + c.opts.ClusterName,
		"--kubeconfig=" + c.OperatorKubeconfig,
		// Redis listens on 127.0.0.1, a loopback address, which the operator
		// refuses for inline endpoints unless allowed; ClusterLockBackends'
		// endpoints are not checked.
		"--endpoint-allow=127.0.0.1/32",
	}
	args = append(args, c.opts.ManagerArgs...)
	if c.operator == nil {
		c.operator = c.newProcess("lockwarden", c.opts.Manager, args, []int{c.ports.webhook, c.ports.metrics, c.ports.probe},
			"POD_NAMESPACE="+OperatorNamespace)
	}
	if !c.operator.running() {
		if err := c.operator.start(); err != nil {
			return err
		}
	}
	return c.waitHTTP(ctx, c.operator, c.ProbeURL+"/readyz", "", func(body string) bool { return body == "ok" })
}

// KillOperator kills the operator with SIGKILL (no cleanup, no release of
// its leader election Lease) and waits until it is gone.
func (c *Cluster) KillOperator() {
	if c.operator != nil {
		c.operator.kill()
	}
}

// StopOperator stops the operator with SIGTERM, as a rolling update would.
func (c *Cluster) StopOperator() {
	if c.operator != nil {
		c.operator.stop()
	}
}

// RestartOperator kills the operator with SIGKILL and starts it again.
func (c *Cluster) RestartOperator(ctx context.Context) error {
	c.KillOperator()
	return c.StartOperator(ctx)
}

// OperatorRunning reports whether the operator process is running.
func (c *Cluster) OperatorRunning() bool { return c.operator != nil && c.operator.running() }

// OperatorPID returns the operator's process id, 0 when it is not running.
func (c *Cluster) OperatorPID() int {
	if c.operator == nil {
		return 0
	}
	return c.operator.pid()
}

// Options returns the options the cluster runs with, defaults filled in: a
// second cluster started from them (with its own Dir) uses the same binaries.
func (c *Cluster) Options() Options {
	o := c.opts
	o.RedisPorts = append([]int(nil), c.opts.RedisPorts...)
	o.ExternalRedis = append([]string(nil), c.opts.ExternalRedis...)
	o.ManagerArgs = append([]string(nil), c.opts.ManagerArgs...)
	return o
}

// LogPath returns the log file of a component: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, kwok, lockwarden or redis-<i>.
func (c *Cluster) LogPath(name string) string { return filepath.Join(c.logDir, name+".log") }

// LogDir is the directory of the components' logs.
func (c *Cluster) LogDir() string { return c.logDir }

// RedisAddrs returns the addresses of the Redis masters.
func (c *Cluster) RedisAddrs() []string {
	out := make([]string, len(c.Redis))
	for i, r := range c.Redis {
		out[i] = r.Addr
	}
	return out
}

// Stop stops everything in reverse order of start and releases the state
// directory (its contents stay, for the logs, until the next Start).
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		for _, p := range []*process{c.operator, c.kwok, c.scheduler, c.kcm, c.apiserver, c.etcd} {
			if p != nil {
				p.stop()
			}
		}
		c.stopStores()
		var wg sync.WaitGroup
		for _, r := range c.Redis {
			if r.proc == nil {
				continue // its start failed before it had a process
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.proc.stop()
			}()
		}
		wg.Wait()
		c.portsMu.Lock()
		freeport.Give(c.held...)
		c.held = nil
		c.portsMu.Unlock()
		if c.lock != nil {
			_ = c.lock.Close()
		}
	})
}

// waitHTTP polls url until check accepts the body of a 200 answer, failing
// early when the process exits.
func (c *Cluster) waitHTTP(ctx context.Context, p *process, url, token string, check func(string) bool) error {
	return c.waitFor(ctx, p, p.name+" at "+url, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.httpClient.Do(req)
		if err != nil {
			return false, nil //nolint:nilerr // not listening yet: poll again
		}
		defer resp.Body.Close()
		body := make([]byte, 512)
		n, _ := resp.Body.Read(body)
		return resp.StatusCode == http.StatusOK && check(strings.TrimSpace(string(body[:n]))), nil
	})
}

// waitFor polls cond until it holds, the process exits or startTimeout
// passes. cond is asked only while the process listens on its ports; an
// error that wraps errPortTaken (from cond, or from an exit while another
// process holds one of the ports) ends the wait at once.
func (c *Cluster) waitFor(ctx context.Context, p *process, what string, cond func(context.Context) (bool, error)) error {
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, startTimeout, true, func(ctx context.Context) (bool, error) {
		if p != nil {
			if err := p.exitedErr(); err != nil {
				return false, err
			}
			if err := p.listening(); err != nil {
				lastErr = err
				return false, nil
			}
		}
		ok, err := cond(ctx)
		if errors.Is(err, errPortTaken) {
			if p != nil {
				p.kill() // it may still be trying; its caller starts another
			}
			return false, err
		}
		if err != nil {
			lastErr = err
			return false, nil
		}
		return ok, nil
	})
	if err == nil {
		return nil
	}
	var detail string
	if lastErr != nil {
		detail = fmt.Sprintf(" (last error: %v)", lastErr)
	}
	if p != nil {
		detail += "\n" + tail(p.logPath, 25)
	}
	return fmt.Errorf("waiting for %s: %w%s", what, err, detail)
}

// tail returns the last n lines of a log file, indented, for error messages.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return fmt.Sprintf("last lines of %s:\n    %s", path, strings.Join(lines, "\n    "))
}
