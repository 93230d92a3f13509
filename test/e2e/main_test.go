//go:build e2e

// Package e2e is lockwarden's end-to-end suite: one local cluster
// (internal/testutil/devcluster: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler, a kwok node, Redis and the operator binary, all processes
// on this machine) serves every test. CronJobs really fire on the
// kube-controller-manager's schedule and kwok "runs" their Pods. The operator
// runs as its ServiceAccount with config/default's RBAC, under its
// ValidatingAdmissionPolicy; the suite fails when the API server refused the
// operator anything.
//
// Run it with `make test-e2e`. E2E_KEEP=1 keeps the cluster's state directory
// (logs of every component) after a passing run; a failing run always keeps it.
package e2e

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
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
	if refused := refusals(c.LogPath("lockwarden")); len(refused) > 0 {
		log.Printf("e2e: the API server refused the operator (RBAC or admission policy) %d times:\n%s", len(refused), strings.Join(refused, "\n"))
		code = 1
	}
	if code == 0 && os.Getenv("E2E_KEEP") == "" {
		_ = os.RemoveAll(dir)
	} else {
		fmt.Fprintf(os.Stderr, "e2e: the cluster's logs are in %s\n", c.LogDir())
	}
	log.Printf("e2e: finished in %s", time.Since(begin).Round(time.Second))
	return code
}

// refusals returns the operator's log lines (at most 20) that report a
// request the API server refused to the operator: RBAC ("is forbidden: User
// ... cannot ...": a rule config/default lacks) or an admission policy (the
// job-gate policy refusing the operator itself). Other refusals, such as
// Events in a namespace being deleted, are not about the install.
func refusals(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return []string{err.Error()}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() && len(out) < 20 {
		if line := sc.Text(); strings.Contains(line, `forbidden: User \"`) || strings.Contains(line, `forbidden: User "`) ||
			strings.Contains(line, "ValidatingAdmissionPolicy '") {
			out = append(out, line)
		}
	}
	return out
}
