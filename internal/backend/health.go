package backend

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// health is the result of a backend's health checks. Reconciles read it
// to fail fast on a backend that does not answer, instead of each waiting
// for its own timeout: a tenant's unreachable backends cost the shared
// workers nothing.
type health struct {
	mu sync.Mutex
	// err is the result of the last check; checked tells whether there was one.
	err     error
	checked bool
	// failures counts the checks that failed in a row.
	failures int

	// configChecked tells whether a check of the servers' settings
	// (lock.ConfigChecker) has completed, at configAt, and found findings.
	configChecked bool
	configAt      time.Time
	findings      []lock.Finding
}

// downAfter is how many health checks in a row must fail before a backend
// that answered is taken for down. A backend never seen answering is down
// at its first failure.
const downAfter = 2

// ErrConnecting says a backend's first health check has not answered yet.
var ErrConnecting = errors.New("connecting: the backend's first health check has not answered yet")

// Health returns the result of the backend's last health check:
// ErrConnecting before the first one has answered, nil while it answers.
func (h Handle) Health() error {
	if h.health == nil {
		return nil
	}
	h.health.mu.Lock()
	defer h.health.mu.Unlock()
	if !h.health.checked {
		return ErrConnecting
	}
	return h.health.err
}

// watch forwards the backend's releases to the listeners until ctx ends,
// subscribing again (with backoff) whenever the subscription fails.
func (r *Registry) watch(ctx context.Context, h Handle) {
	backoff := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 1 << 30, Cap: 10 * time.Second}
	for ctx.Err() == nil {
		ch, err := h.Locker.Watch(ctx)
		if err != nil {
			r.log.V(2).Info("Subscribing to releases failed; retrying", "backend", h.ID, "error", err.Error())
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff.Step()):
			}
			continue
		}
		backoff.Duration = 100 * time.Millisecond
		for key := range ch {
			r.mu.Lock()
			listeners := slices.Clone(r.listeners)
			r.mu.Unlock()
			for _, f := range listeners {
				f(h.ID, key)
			}
		}
	}
}

// checkHealth pings the backend every health interval and tells the health
// listeners when the answer changes. While it answers, it also reads the
// servers' settings (when the Locker is a lock.ConfigChecker) at once and
// then every config interval, and tells the listeners when the findings change.
func (r *Registry) checkHealth(ctx context.Context, e *entry) {
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		pctx, cancel := context.WithTimeout(ctx, r.healthInterval)
		err := e.handle.Locker.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		h := e.handle.health
		h.mu.Lock()
		if err == nil {
			h.failures = 0
		} else {
			h.failures++
		}
		if err != nil && h.checked && h.err == nil && h.failures < downAfter {
			// One slow ping does not mark an answering backend down (its
			// locks would fail fast for a whole interval): the next must fail too.
			h.mu.Unlock()
			return
		}
		changed := !h.checked || (h.err == nil) != (err == nil)
		h.err, h.checked = err, true
		// Read the settings again when the backend comes back: it may be
		// another server now (a restart, a failover).
		due := err == nil && (changed || !h.configChecked || time.Since(h.configAt) >= r.configInterval)
		h.mu.Unlock()
		findingsChanged := due && r.checkConfig(ctx, e)
		r.mu.Lock()
		listeners := slices.Clone(r.health)
		r.mu.Unlock()
		if !changed && !findingsChanged {
			return
		}
		if changed {
			if err != nil {
				r.log.Info("Lock backend stopped answering", "backend", e.handle.ID, "error", err.Error())
			} else {
				r.log.V(1).Info("Lock backend answers", "backend", e.handle.ID)
			}
		}
		for _, f := range listeners {
			f(e.handle.ID, err)
		}
	}, r.healthInterval)
}

// checkConfig reads the servers' settings of a backend whose Locker can
// (lock.ConfigChecker), and reports whether the findings changed. The last
// findings of a server that does not answer are kept.
func (r *Registry) checkConfig(ctx context.Context, e *entry) bool {
	cc, ok := e.handle.Locker.(lock.ConfigChecker)
	if !ok {
		return false
	}
	cctx, cancel := context.WithTimeout(ctx, r.healthInterval)
	found, err := cc.CheckServers(cctx)
	cancel()
	if ctx.Err() != nil {
		return false
	}
	h := e.handle.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		r.log.V(1).Info("Could not read the settings of every server of a lock backend", "backend", e.handle.ID, "error", err.Error())
		down := map[string]bool{}
		for _, n := range nodeErrors(err) {
			down[n] = true
		}
		for _, f := range h.findings {
			if down[f.Node] {
				found = append(found, f)
			}
		}
	}
	slices.SortFunc(found, func(a, b lock.Finding) int { return strings.Compare(a.Node+"\x00"+a.Setting, b.Node+"\x00"+b.Setting) })
	for _, f := range found {
		if !slices.Contains(h.findings, f) {
			r.log.Info("A lock backend's server has an unsafe setting", "backend", e.handle.ID, "node", f.Node, "setting", f.Setting, "found", f.Found, "want", f.Want)
		}
	}
	changed := !h.configChecked || !slices.Equal(h.findings, found)
	h.findings, h.configChecked, h.configAt = found, true, time.Now()
	return changed
}

// nodeErrors returns the nodes named by the *lock.NodeErrors in err (joined or wrapped).
func nodeErrors(err error) []string {
	var multi interface{ Unwrap() []error }
	if errors.As(err, &multi) {
		var out []string
		for _, e := range multi.Unwrap() {
			out = append(out, nodeErrors(e)...)
		}
		return out
	}
	if ne := (*lock.NodeError)(nil); errors.As(err, &ne) {
		return []string{ne.Node}
	}
	return nil
}

// ConfigOf returns what the settings checks of the open backends with ID id
// found (lock.ConfigChecker): checked is false when none has completed (no
// backend with that ID is open, its Locker does not check settings, or it
// has not answered yet).
func (r *Registry) ConfigOf(id string) (checked bool, findings []lock.Finding) {
	handles := r.handlesOf(id)
	for _, h := range handles {
		if h.health == nil {
			continue
		}
		h.health.mu.Lock()
		if h.health.configChecked {
			checked = true
			for _, f := range h.health.findings {
				if !slices.Contains(findings, f) {
					findings = append(findings, f)
				}
			}
		}
		h.health.mu.Unlock()
	}
	return checked, findings
}
