// Command dev is `make dev`: it runs a local Kubernetes control plane
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler and a kwok
// node), Redis and the lockwarden operator on this machine as child
// processes, prints how to reach them, streams the operator's log and stops
// everything on Ctrl-C. The operator runs as its ServiceAccount with
// config/default's RBAC, under config/default's admission policy, as in a
// real install; a ClusterLockBackend dev-redis points at the (first) Redis.
// With BACKEND=postgres, zookeeper or etcd it also starts that store on
// loopback; the ClusterLockBackend dev, which config/samples' locks name,
// points at that store (at the first Redis for BACKEND=redis, the default;
// at the local API server's Leases for BACKEND=kubernetes, which starts
// nothing more).
//
// Usage (from the checkout): make dev [REDLOCK=1] [BACKEND=redis|postgres|zookeeper|etcd|kubernetes]
//
//	go run ./hack/dev [-redlock] [-backend redis] [-dir .dev] [-leader-elect]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/devcluster"
)

// The samples in config/samples name these Redis endpoints (the
// ClusterLockBackend dev-redis and the inline ones).
var (
	standalonePorts = []int{6379}
	redlockPorts    = []int{6380, 6381, 6382}
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dev:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		redlock     = flag.Bool("redlock", truthy(os.Getenv("REDLOCK")), "Start three independent Redis masters (on 6380-6382 when free) instead of one (on 6379 when free). Default from $REDLOCK.")
		dir         = flag.String("dir", "", "State directory, emptied at start. Default: .dev in the checkout.")
		leaderElect = flag.Bool("leader-elect", false, "Run the operator with leader election.")
		backend     = flag.String("backend", os.Getenv("BACKEND"), "The store the ClusterLockBackend "+devcluster.DevBackend+" points at: "+strings.Join(devcluster.StoreKinds, ", ")+" (started on loopback beside Redis). Default from $BACKEND, else redis.")
		noBuild     = flag.Bool("no-build", false, "Use bin/lockwarden as it is instead of rebuilding it.")
	)
	flag.Parse()
	*backend = strings.TrimSpace(*backend)
	if err := devcluster.ValidateStore(*backend); err != nil {
		return fmt.Errorf("BACKEND / -backend: %w", err)
	}
	if *backend == "" {
		*backend = devcluster.StoreRedis
	}
	begin := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "[dev] "+format+"\n", args...)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	root, err := devcluster.FindRoot()
	if err != nil {
		return err
	}
	logf("control-plane binaries: hack/control-plane.sh --e2e (builds them on first use, cached afterwards)")
	assets, err := devcluster.FindAssets(root)
	if err != nil {
		return err
	}
	manager := filepath.Join(root, "bin", "lockwarden")
	if _, err := os.Stat(manager); err != nil || !*noBuild {
		logf("building the operator: go build -o bin/lockwarden ./cmd")
		if err := devcluster.BuildManager(ctx, root, manager); err != nil {
			return err
		}
	}
	ports := standalonePorts
	if *redlock {
		ports = redlockPorts
	}
	logf("starting the cluster in %s", displayDir(root, *dir))
	c, err := devcluster.Start(ctx, devcluster.Options{
		Dir:         *dir,
		Root:        root,
		Assets:      assets,
		Manager:     manager,
		RedisPorts:  ports,
		Store:       *backend,
		LeaderElect: *leaderElect,
		ManagerArgs: []string{"--zap-devel", "--resync-period=10s"},
		Logf:        logf,
	})
	if err != nil {
		return err
	}
	defer func() {
		logf("stopping everything")
		c.Stop()
		logf("stopped; logs stay in %s until the next make dev", c.LogDir())
	}()
	printBanner(os.Stdout, root, c, ports, *redlock, time.Since(begin))

	go follow(ctx, c.LogPath("lockwarden"), os.Stdout)
	<-ctx.Done()
	fmt.Println()
	return nil
}

func truthy(s string) bool {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
}

func displayDir(root, dir string) string {
	if dir == "" {
		return filepath.Join(root, ".dev")
	}
	return dir
}

// printBanner says how to use the cluster.
func printBanner(w io.Writer, root string, c *devcluster.Cluster, wanted []int, redlock bool, took time.Duration) {
	kubectl := "kubectl"
	if _, err := exec.LookPath("kubectl"); err != nil {
		kubectl = filepath.Join(root, "bin", "kubectl")
		if _, err := os.Stat(kubectl); err != nil {
			kubectl = filepath.Join(c.Assets, "kubectl")
		}
	}
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	p("")
	p("lockwarden dev cluster is ready (%s).", took.Round(100*time.Millisecond))
	p("")
	p("In another terminal:")
	p("")
	p("  export KUBECONFIG=%s", c.Kubeconfig)
	if kubectl != "kubectl" {
		p("  alias kubectl=%s", kubectl)
	}
	p("  cd %s", root)
	p("")
	p("API server:  %s (kube-controller-manager, kube-scheduler, kwok node %s)", c.APIServerURL, devcluster.NodeName)
	var moved []string
	for i, r := range c.Redis {
		p("Redis:       %s", r.Addr)
		if wanted[i] != 0 && r.Port != wanted[i] {
			moved = append(moved, fmt.Sprintf("127.0.0.1:%d -> %s", wanted[i], r.Addr))
		}
	}
	if len(moved) > 0 {
		p("             (ports in use; the samples name the wanted ones, edit their endpoints: %s;", strings.Join(moved, ", "))
		p("             the ClusterLockBackend %s names %s, but applying config/samples resets it to the sample's)", devcluster.DevRedisBackend, c.Redis[0].Addr)
	}
	if s := c.Store; s != nil && s.Kind != devcluster.StoreRedis {
		p("%-12s %s (log %s)", storeTitle(s.Kind)+":", strings.Join(s.Addrs, ", "), strings.Join(s.LogPaths, ", "))
		if s.Kind == devcluster.StorePostgres {
			p("             database %s, user %s, password in Secret %s/%s", s.Database, s.User, devcluster.OperatorNamespace, devcluster.PasswordSecretName(devcluster.DevBackend))
		}
	}
	p("Backends:    ClusterLockBackend %s -> %s, every namespace (kubectl get clusterlockbackends)", devcluster.DevBackend, c.Store)
	p("             ClusterLockBackend %s -> redis at %s, every namespace", devcluster.DevRedisBackend, c.Redis[0].Addr)
	p("Operator:    metrics %s, webhook %s", c.MetricsURL, c.WebhookURL)
	p("             runs as %s with config/default's RBAC;", devcluster.OperatorUser)
	p("             inline endpoints allowed on 127.0.0.1 only (--endpoint-allow=127.0.0.1/32)")
	p("Admission:   ValidatingAdmissionPolicy %s: only the operator may unsuspend a gated Job or", devcluster.JobGatePolicy)
	p("             change its lockwarden.io label, annotations or finalizer; deleting it always works")
	p("Logs:        %s/<component>.log", c.LogDir())
	p("")
	p("Try:")
	p("  kubectl get clusterlockbackends                 # dev (%s), dev-redis: what locks name in spec.backend.clusterBackendRef", c.Store.Kind)
	if redlock {
		p("  kubectl apply -f config/samples/locks_v1alpha1_distributedlock_redlock.yaml")
		p("  kubectl get dlock reports -o wide -w            # held by a manual holder on 2 of 3 masters or more")
		p("  kubectl describe dlock reports")
	} else {
		p("  kubectl apply -k config/samples                 # ClusterLockBackend dev-redis, locks billing (on dev) and")
		p("                                                  # maintenance-window (inline endpoints), two CronJobs sharing billing")
		p("  kubectl get dlock -w -o wide                    # NAME KEYS HOLDER FENCE HELD SLOTS QUEUE EXPIRES BACKEND AGE")
		p("  kubectl get jobs -w                             # every minute, the two CronJobs' Jobs run one at a time")
		p("  kubectl apply -f config/samples/batch_v1_job_fenced.yaml")
		p("  kubectl get job fenced-write -o jsonpath='{.metadata.annotations.lockwarden\\.io/fencing-token}'")
		p("  kubectl describe dlock billing")
		p("  kubectl wait --for=condition=ManualHolderHeld dlock/maintenance-window")
		p("  kubectl annotate cronjob ledger-compaction lockwarden.io/contention=Skip")
		p("  kubectl delete -k config/samples")
	}
	p("")
	p("The operator's log follows. Ctrl-C stops everything.")
	p("")
}

// storeTitle is how the banner names a store.
func storeTitle(kind string) string {
	switch kind {
	case devcluster.StorePostgres:
		return "PostgreSQL"
	case devcluster.StoreZooKeeper:
		return "ZooKeeper"
	}
	return kind
}

// follow copies a growing file to w until ctx ends.
func follow(ctx context.Context, path string, w io.Writer) {
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dev: follow operator log:", err)
		return
	}
	defer f.Close()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := io.Copy(w, f); err != nil && !errors.Is(err, io.EOF) {
			fmt.Fprintln(os.Stderr, "dev: follow operator log:", err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
