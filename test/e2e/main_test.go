//go:build e2e

// Package e2e is lockwarden's end-to-end suite: one local cluster
// (internal/testutil/devcluster: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, a kwok node, Redis and the operator binary, all processes
// on this machine) serves every test. CronJobs really fire on the
// kube-controller-manager's schedule and kwok "runs" their Pods.
//
// Run it with `make test-e2e`. E2E_KEEP=1 keeps the cluster's state directory
// (logs of every component) after a passing run; a failing run always keeps it.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/devcluster"
)

// cluster is the cluster every test uses.
var cluster *devcluster.Cluster

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runSuite(m))
}

func runSuite(m *testing.M) int {
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "lockwarden-e2e-")
	if err != nil {
		log.Print(err)
		return 1
	}
	c, err := devcluster.StartFromSource(ctx, dir, devcluster.Options{
		// The operator runs as it would in production, with leader
		// election, but with a short election lease, so that a replacement
		// takes over quickly after a kill -9. minSafeTTL stays below the
		// tests' TTL of 30 s.
		LeaderElect: true,
		ManagerArgs: []string{
			"--leader-election-lease-duration=6s",
			"--leader-election-renew-deadline=4s",
			"--leader-election-retry-period=1s",
			// Status follows Redis within seconds, so that an outage shows quickly.
			"--resync-period=2s",
		},
		Logf: func(format string, args ...any) { log.Printf("[cluster] "+format, args...) },
	})
	if err != nil {
		log.Printf("start the cluster: %v\n(state and logs in %s)", err, dir)
		return 1
	}
	cluster = c
	log.Printf("[cluster] ready in %s; logs in %s", time.Since(begin).Round(100*time.Millisecond), c.LogDir())
	code := m.Run()
	c.Stop()
	if code == 0 && os.Getenv("E2E_KEEP") == "" {
		_ = os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: the cluster's logs are in %s\n", c.LogDir())
	}
	log.Printf("e2e: finished in %s", time.Since(begin).Round(time.Second))
	return code
}
