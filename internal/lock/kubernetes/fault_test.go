package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/lock/locktest"
)

// faultRuns is how many seeded runs a fault test makes (each lasts about
// 1.5s), fewer with -short.
func faultRuns(n int) int {
	if testing.Short() {
		return max(n/2, 1)
	}
	return n
}

// faultClients is how many clients a run has (locktest's default for a
// mutex; Limit+2 for a semaphore, at most 5 here).
const faultClients = 5

// faultLockers returns a fault run's newLocker: each client reaches the
// API server through its own Link (so that one operator can be cut off
// from the API server while the others go on), on one prefix. The calls'
// timeout is short: the runs' TTL is 300ms.
func faultLockers(t *testing.T, prefix string, opts ...Option) (func(t *testing.T) lock.Locker, []*locktest.Link) {
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	links := locktest.NewLinks(t, slices.Repeat([]string{u.Host}, faultClients))
	var next atomic.Int32
	opts = append([]Option{WithWaiterTTL(time.Second), WithOpTimeout(400 * time.Millisecond)}, opts...)
	return func(t *testing.T) lock.Locker {
		link := links[int(next.Add(1)-1)%len(links)]
		cfg := rest.CopyConfig(env.Config)
		cfg.Host = "https://" + link.Addr()
		cfg.ServerName = u.Hostname()
		cfg.QPS, cfg.Burst = 1000, 2000
		cfg.Timeout = time.Second
		return newTestLocker(t, Config{Client: clientFor(t, cfg), Prefix: prefix}, opts...)
	}, links
}

// TestFaultsFencedRegister runs the fenced-register fault test of locktest
// (exclusion and fencing tokens) while an operator is cut off from the API
// server (partition, black hole, latency on its link) and while the API
// server or its etcd stalls (SIGSTOP, past the runs' TTL at times).
func TestFaultsFencedRegister(t *testing.T) {
	needEnv(t)
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, faultRuns(8)) {
		newLocker, links := faultLockers(t, fmt.Sprintf("faults-%d", seed))
		locktest.RunFaults(t, "mutex", seed, &tally, locktest.Faults{
			NewLocker: newLocker,
			Nemeses:   kubeNemeses(t, links),
			Policies:  true,
		})
	}
	tally.Check(t)
}

// TestFaultsSemaphore runs the semaphore fault test (at most Limit slots
// taken by valid leases at once, tokens strictly increasing) under the
// same nemeses, with 2 and 3 slots, some requests taking several
// (Request.Weight).
func TestFaultsSemaphore(t *testing.T) {
	needEnv(t)
	var tally locktest.FaultTally
	for seed := range tally.Seeds(t, faultRuns(6)) {
		limit := 2 + int(seed%2)
		newLocker, links := faultLockers(t, fmt.Sprintf("semfaults-%d", seed))
		locktest.RunFaults(t, fmt.Sprintf("limit-%d", limit), seed, &tally, locktest.Faults{
			NewLocker: newLocker,
			Nemeses:   kubeNemeses(t, links),
			Limit:     limit,
			Weights:   true,
		})
	}
	tally.Check(t)
}

// TestFaultHarnessCatchesAMutant is the negative control: contenders that
// take a session for expired 150ms before its 300ms TTL ends, and a client
// that reports its leases valid 200ms longer than they are, must each fail
// the exclusion check.
func TestFaultHarnessCatchesAMutant(t *testing.T) {
	needEnv(t)
	mutants := map[string]func(t *testing.T) func(t *testing.T) lock.Locker{
		"early-expiry": func(t *testing.T) func(t *testing.T) lock.Locker {
			newLocker, _ := faultLockers(t, "mutant-early-"+t.Name(), func(o *options) { o.earlyExpiry = 150 * time.Millisecond })
			return newLocker
		},
		"late-expiry": func(t *testing.T) func(t *testing.T) lock.Locker {
			newLocker, _ := faultLockers(t, "mutant-late-"+t.Name())
			return func(t *testing.T) lock.Locker { return locktest.LateExpiry(newLocker(t), 200*time.Millisecond) }
		},
	}
	for name, mutant := range mutants {
		for kind, limit := range map[string]int{"mutex": 1, "semaphore": 2} {
			t.Run(name+"/"+kind, func(t *testing.T) {
				err := locktest.FindViolation(t, 5, locktest.Faults{NewLocker: mutant(t), Limit: limit})
				var ex *locktest.ExclusionError
				if !errors.As(err, &ex) {
					t.Fatalf("the fault harness passed the %s mutant (%v): it cannot catch two valid holders", name, err)
				}
			})
		}
	}
}

// kubeNemeses are the link nemeses of the clients' links and the pauses
// of the control plane's processes.
func kubeNemeses(t *testing.T, links []*locktest.Link) []locktest.Nemesis {
	apiserver, etcd := controlPlanePIDs(t)
	pause := func(name string, pid int) locktest.Nemesis {
		n := locktest.PauseResume(t, 800*time.Millisecond, func(*rand.Rand) (func() error, func() error) {
			return func() error { return syscall.Kill(pid, syscall.SIGSTOP) }, func() error { return syscall.Kill(pid, syscall.SIGCONT) }
		})
		n.Name = name
		return n
	}
	lostReplies := locktest.Nemesis{Name: "lost-replies", Inject: func(ctx context.Context, rng *rand.Rand) {
		// The API server applies the writes; the operator never hears.
		heal := links[rng.IntN(len(links))].DropReplies()
		defer heal()
		timer := time.NewTimer(time.Duration(100+rng.IntN(500)) * time.Millisecond)
		defer timer.Stop()
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
	}}
	return append(locktest.LinkNemeses(links, 800*time.Millisecond),
		pause("pause-apiserver", apiserver), pause("pause-etcd", etcd), lostReplies)
}

// controlPlanePIDs finds the processes of the package's kube-apiserver (by
// its secure port) and of its etcd (by the client URL the API server uses).
func controlPlanePIDs(t *testing.T) (apiserver, etcd int) {
	t.Helper()
	u, err := url.Parse(env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	cmdlines := map[int][]string{}
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, d := range dirs {
		raw, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		cmdlines[pid] = strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	}
	var etcdURL string
	for pid, args := range cmdlines {
		if len(args) == 0 || filepath.Base(args[0]) != "kube-apiserver" || !slices.Contains(args, "--secure-port="+u.Port()) {
			continue
		}
		apiserver = pid
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--etcd-servers="); ok {
				etcdURL = v
			}
		}
	}
	for pid, args := range cmdlines {
		if len(args) > 0 && filepath.Base(args[0]) == "etcd" && etcdURL != "" && slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, etcdURL) }) {
			etcd = pid
		}
	}
	if apiserver == 0 || etcd == 0 {
		t.Fatalf("found kube-apiserver %d and etcd %d (etcd URL %q): want both", apiserver, etcd, etcdURL)
	}
	return apiserver, etcd
}
