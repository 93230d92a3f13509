// Package backend decides which backend a DistributedLock may use (the
// operator's policy and the ClusterLockBackends'), builds it from the spec
// and its Secrets, shares one client per distinct backend, rebuilds a client
// when a referenced Secret changes, and closes clients nobody uses.
package backend

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
)

// KeyPrefix is prepended to every Redis key lockwarden writes. (The other
// stores keep their data apart by their own means: a schema, a root znode,
// a key prefix.)
const KeyPrefix = "lockwarden:"

// Locker is a lock backend that can also report its reachability.
type Locker interface {
	lock.Locker
	Ping(ctx context.Context) error
}

// Handle is a lock's view of its backend.
type Handle struct {
	// ID names the backend as LockBackendID does: the ClusterLockBackend,
	// or the inline Redis (mode, endpoints, database), never credentials.
	ID string
	// Locker is the shared client.
	Locker Locker

	health *health
	// slots bounds the reconciles using the backend at once (Enter); nil:
	// no bound.
	slots chan struct{}
}

// ErrBusy says a backend already serves as many reconciles as it may at
// once (SetBulkhead): the reconcile comes back later without calling it,
// so that one slow backend cannot hold every shared worker.
var ErrBusy = errors.New("busy: the backend already serves as many reconciles as it may at once")

// Enter takes one of the backend's reconcile slots: ok is false when all
// are taken (ErrBusy). leave gives the slot back; call it once the
// reconcile is done with the backend.
func (h Handle) Enter() (leave func(), ok bool) {
	if h.slots == nil {
		return func() {}, true
	}
	select {
	case h.slots <- struct{}{}:
		var once sync.Once
		return func() { once.Do(func() { <-h.slots }) }, true
	default:
		return func() {}, false
	}
}

// SecretError says a Secret or key that a lock references is missing or
// unreadable, or holds a value over its size limit.
type SecretError struct {
	Field string
	Err   error
}

func (e *SecretError) Error() string { return fmt.Sprintf("%s: %v", e.Field, e.Err) }

// Unwrap returns the cause.
func (e *SecretError) Unwrap() error { return e.Err }

// ConfigError says the backend configuration cannot be used.
type ConfigError struct {
	Field string
	Err   error
}

func (e *ConfigError) Error() string { return fmt.Sprintf("%s: %v", e.Field, e.Err) }

// Unwrap returns the cause.
func (e *ConfigError) Unwrap() error { return e.Err }

// NewLockerFunc builds a Locker from a resolved backend (NewLocker is the manager's).
type NewLockerFunc func(cfg Config) (Locker, error)

// HealthFunc is told when a backend in use starts or stops answering (err
// nil: it answers), and when the findings of its settings check change.
type HealthFunc func(backendID string, err error)

// ReleaseFunc is told the backend ID and key (as the lock names it, with the
// scope prefix) of every release seen on a backend in use.
type ReleaseFunc func(backendID, key string)

// Registry shares backends between locks. It is safe for concurrent use.
type Registry struct {
	reader client.Reader
	// objects reads ClusterLockBackends and Namespaces (the manager's cache).
	objects   client.Reader
	policy    Policy
	newLocker NewLockerFunc
	log       logr.Logger

	healthInterval time.Duration
	configInterval time.Duration
	bulkhead       int
	secretTTL      time.Duration

	// secrets remembers the keys of Secrets read recently (secretKey to
	// cachedSecret), so that many locks (and their Jobs) that share one
	// Secret cost one read per secretTTL, not one per reconcile. It keeps
	// the values only, secretBytes in all, at most maxCachedSecretBytes.
	secretsMu   sync.Mutex
	secrets     *lru.Cache
	secretBytes int

	mu        sync.Mutex
	entries   map[string]*entry     // by fingerprint
	users     map[holder.Ref]string // holder -> fingerprint
	listeners []ReleaseFunc
	health    []HealthFunc
	ctx       context.Context
}

type entry struct {
	handle Handle
	users  map[holder.Ref]struct{}
	cancel context.CancelFunc
}

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

// DefaultHealthInterval is how often every backend in use is pinged.
const DefaultHealthInterval = 2 * time.Second

// DefaultConfigCheckInterval is how often the settings of the servers of a
// backend in use are read again (lock.ConfigChecker), besides when it starts
// answering.
const DefaultConfigCheckInterval = time.Minute

// DefaultSecretTTL is how long a Secret read for a lock is reused: a changed
// Secret takes effect within it (and the lock's next reconcile).
const DefaultSecretTTL = 10 * time.Second

// NewRegistry returns a registry that reads Secrets with reader (a direct
// API reader, so no Secret is cached) and builds Lockers with newLocker. ctx
// bounds the release watches of every backend.
func NewRegistry(ctx context.Context, reader client.Reader, newLocker NewLockerFunc, log logr.Logger) *Registry {
	r := &Registry{
		reader:         reader,
		objects:        reader,
		newLocker:      newLocker,
		log:            log,
		healthInterval: DefaultHealthInterval,
		configInterval: DefaultConfigCheckInterval,
		secretTTL:      DefaultSecretTTL,
		entries:        map[string]*entry{},
		users:          map[holder.Ref]string{},
		ctx:            ctx,
	}
	// No bound on the number of entries: their bytes bound them. Evictions
	// happen with secretsMu held.
	r.secrets = lru.NewWithEvictionFunc(0, func(k lru.Key, v any) {
		r.secretBytes -= k.(secretKey).size(v.(cachedSecret))
	})
	return r
}

// SetPolicy sets the policy Check and For apply, and the reader of
// ClusterLockBackends and Namespaces (default: the Secret reader), before
// first use. Without it, inline endpoints are allowed anywhere and scope
// Global nowhere.
func (r *Registry) SetPolicy(p Policy, objects client.Reader) {
	r.policy = p
	if objects != nil {
		r.objects = objects
	}
}

// SetBulkhead bounds how many reconciles may use one backend at once (see
// Handle.Enter); 0 (the default) sets no bound. It applies to backends
// built after the call.
func (r *Registry) SetBulkhead(n int) { r.bulkhead = n }

// SetHealthInterval changes how often backends are pinged (before first use).
func (r *Registry) SetHealthInterval(d time.Duration) { r.healthInterval = d }

// SetConfigCheckInterval changes how often the servers' settings are read
// again (before first use).
func (r *Registry) SetConfigCheckInterval(d time.Duration) { r.configInterval = d }

// SetSecretTTL changes how long a Secret read is reused (before first use).
func (r *Registry) SetSecretTTL(d time.Duration) { r.secretTTL = d }

// OnHealth registers f to be told when a backend starts or stops answering,
// and when the findings of its settings check change (see ConfigOf).
func (r *Registry) OnHealth(f HealthFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.health = append(r.health, f)
}

// OnRelease registers f to be told of releases on every backend in use.
func (r *Registry) OnRelease(f ReleaseFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.listeners = append(r.listeners, f)
}

// For returns the backend of dl for user (the object that holds through
// it), building it when no other user shares it. The
// user stops using the backend it had before, which is closed when nobody
// else uses it.
func (r *Registry) For(ctx context.Context, user holder.Ref, dl *locksv1alpha1.DistributedLock) (Handle, error) {
	src, err := r.check(ctx, dl)
	if err != nil {
		return Handle{}, err
	}
	cfg, fingerprint, err := r.resolve(ctx, src)
	if err != nil {
		return Handle{}, err
	}
	id, field := src.id, src.field
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[fingerprint]
	if !ok {
		l, err := r.newLocker(cfg)
		if err != nil {
			return Handle{}, &ConfigError{Field: field, Err: err}
		}
		wctx, cancel := context.WithCancel(r.ctx)
		e = &entry{handle: Handle{ID: id, Locker: l, health: &health{}}, users: map[holder.Ref]struct{}{}, cancel: cancel}
		if r.bulkhead > 0 {
			e.handle.slots = make(chan struct{}, r.bulkhead)
		}
		r.entries[fingerprint] = e
		go r.watch(wctx, e.handle)
		go r.checkHealth(wctx, e)
		r.log.V(1).Info("Built lock backend", "backend", id)
	}
	if old, had := r.users[user]; had && old != fingerprint {
		r.dropLocked(user, old)
	}
	e.users[user] = struct{}{}
	r.users[user] = fingerprint
	return e.handle, nil
}

// Forget drops user's use of its backend, closing the backend when nobody uses it.
func (r *Registry) Forget(user holder.Ref) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fp, ok := r.users[user]; ok {
		r.dropLocked(user, fp)
	}
}

// Users returns every holder that uses a backend now.
func (r *Registry) Users() []holder.Ref {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Collect(maps.Keys(r.users))
}

// handlesOf returns the open backends with ID id.
func (r *Registry) handlesOf(id string) []Handle {
	r.mu.Lock()
	defer r.mu.Unlock()
	var handles []Handle
	for _, e := range r.entries {
		if e.handle.ID == id {
			handles = append(handles, e.handle)
		}
	}
	return handles
}

// Open returns an open backend with ID id, for a read on behalf of its
// users (the Job controller inspects a released key through it, once for
// all the waiters of that key), preferring one that answers its health
// checks; ok is false when none is open. It makes nobody its user: the
// backend stays open only as long as its users keep it, and a read through
// a handle closed meanwhile fails.
func (r *Registry) Open(id string) (h Handle, ok bool) {
	for _, c := range r.handlesOf(id) {
		if !ok || (h.Health() != nil && c.Health() == nil) {
			h, ok = c, true
		}
	}
	return h, ok
}

// HealthOf returns the health of the open backends with ID id (see
// Handle.Health): inUse is false when none is open. One that does not answer
// makes the answer an error.
func (r *Registry) HealthOf(id string) (inUse bool, err error) {
	handles := r.handlesOf(id)
	for _, h := range handles {
		if herr := h.Health(); herr != nil && (err == nil || errors.Is(err, ErrConnecting)) {
			err = herr
		}
	}
	return len(handles) > 0, err
}

// Len returns the number of open backends.
func (r *Registry) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}

func (r *Registry) dropLocked(user holder.Ref, fingerprint string) {
	delete(r.users, user)
	e, ok := r.entries[fingerprint]
	if !ok {
		return
	}
	delete(e.users, user)
	if len(e.users) > 0 {
		return
	}
	delete(r.entries, fingerprint)
	e.cancel()
	if err := e.handle.Locker.Close(); err != nil {
		r.log.Error(err, "Closing unused lock backend", "backend", e.handle.ID)
	}
	r.log.V(1).Info("Closed unused lock backend", "backend", e.handle.ID)
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

// Size limits of the Secret values a backend reads: a value over its limit
// is refused (a SecretError naming the Secret, the key and the limit) and
// not kept. Far beyond any real value, they bound what a tenant who owns the
// referenced Secrets makes the operator hold.
const (
	// maxCredentialBytes bounds a password or a ZooKeeper digest: room for
	// long tokens used as passwords (cloud identity tokens run to a few KiB).
	// A value read with this limit must be printable (controlByte).
	maxCredentialBytes = 64 << 10
	// maxCABundleBytes bounds a CA bundle (PEM): twice a full public
	// bundle of about 150 roots (some 220 KiB), so a private CA appended
	// to one fits.
	maxCABundleBytes = 512 << 10
	// maxCachedSecretBytes bounds the Secret values kept between reads, in
	// all: past it the least recently used are dropped (and read again when
	// needed). Thousands of real passwords and CAs fit.
	maxCachedSecretBytes = 16 << 20
	// cachedSecretOverhead is what one kept value costs besides its bytes
	// and its Secret's name: the entry, the list element and the map slot.
	cachedSecretOverhead = 256
)

// secretValue reads one key of a Secret in namespace: the lock's own, or
// the operator's for a ClusterLockBackend. A lock cannot name another
// namespace: it cannot reach another tenant's Secrets. A value longer than
// limit bytes is refused; what is a limit for is named in the error.
func (r *Registry) secretValue(ctx context.Context, namespace, field string, ref *locksv1alpha1.SecretKeyRef, limit int, what string) (string, error) {
	v, err := r.readSecretKey(ctx, secretKey{namespace: namespace, name: ref.Name, key: ref.Key}, limit, what)
	if err != nil {
		return "", &SecretError{Field: field, Err: err}
	}
	return v, nil
}

// controlByte returns the index of the first control byte of v (below
// 0x20, or 0x7f), or -1 when there is none.
func controlByte(v string) int {
	return strings.IndexFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f })
}

// secretKey names one key of a Secret.
type secretKey struct{ namespace, name, key string }

// cachedSecret is one key of a Secret as read at at: its value, or why
// there is none (the Secret or key is missing, the value too long).
type cachedSecret struct {
	value string
	err   error
	at    time.Time
	// limit is the limit the value was checked against.
	limit int
}

func (k secretKey) size(c cachedSecret) int {
	return len(k.namespace) + len(k.name) + len(k.key) + len(c.value) + cachedSecretOverhead
}

// readSecretKey returns the value of one key of a Secret, reading the
// Secret at most once per secretTTL. Only that value is kept (within the
// cache's byte bound), never the rest of the Secret.
func (r *Registry) readSecretKey(ctx context.Context, k secretKey, limit int, what string) (string, error) {
	now := time.Now()
	r.secretsMu.Lock()
	v, ok := r.secrets.Get(k)
	r.secretsMu.Unlock()
	if ok {
		if c := v.(cachedSecret); now.Sub(c.at) < r.secretTTL && c.limit == limit {
			return c.value, c.err
		}
	}
	var s corev1.Secret
	err := r.reader.Get(ctx, types.NamespacedName{Namespace: k.namespace, Name: k.name}, &s)
	var c cachedSecret
	switch data, found := s.Data[k.key]; {
	case apierrors.IsNotFound(err):
		c.err = fmt.Errorf("the Secret %s/%s was not found", k.namespace, k.name)
	case err != nil:
		// Not kept: a transient error is retried at once.
		return "", fmt.Errorf("reading Secret %s/%s: %w", k.namespace, k.name, err)
	case !found:
		c.err = fmt.Errorf("the Secret %s/%s has no key %q", k.namespace, k.name, k.key)
	case len(data) > limit:
		c.err = fmt.Errorf("the Secret %s/%s key %q holds %d bytes; %s may hold at most %d KiB", k.namespace, k.name, k.key, len(data), what, limit>>10)
	case len(data) == 0:
		// Not "no authentication": a Secret emptied by mistake must not
		// silently turn AUTH off.
		c.err = fmt.Errorf("the Secret %s/%s key %q is empty; %s must not be empty (to connect without one, remove the reference)", k.namespace, k.name, k.key, what)
	case limit == maxCredentialBytes && controlByte(string(data)) >= 0:
		// A credential reaches the server verbatim, before the operator
		// has seen a byte of what the server is: CR, LF and the like
		// would let it form requests of another, line-based protocol.
		c.err = fmt.Errorf("the Secret %s/%s key %q holds a control character at byte %d (below 0x20, or 0x7f: CR and LF included, a trailing newline too); %s must be printable", k.namespace, k.name, k.key, controlByte(string(data)), what)
	default:
		c.value = string(data)
	}
	c.at, c.limit = now, limit
	r.secretsMu.Lock()
	defer r.secretsMu.Unlock()
	r.secrets.Remove(k) // Add would replace the value without counting it out
	r.secrets.Add(k, c)
	r.secretBytes += k.size(c)
	for r.secretBytes > maxCachedSecretBytes && r.secrets.Len() > 0 {
		r.secrets.RemoveOldest()
	}
	return c.value, c.err
}

// ID names a backend by what decides which keys it holds (mode, endpoints,
// database), not by its credentials: locks with equal IDs share keys.
func ID(rb *locksv1alpha1.RedisBackend) string {
	if rb == nil {
		return ""
	}
	endpoints := slices.Clone(rb.Endpoints)
	slices.Sort(endpoints)
	mode := "standalone"
	switch {
	case rb.Sentinel != nil:
		mode = "sentinel:" + rb.Sentinel.MasterName
	case len(endpoints) > 1:
		mode = "redlock"
	}
	return fmt.Sprintf("%s/%s/db%d", mode, strings.Join(endpoints, ","), rb.DB)
}

// EngineKeys returns the store-side names of dl's keys: prefixed with the
// namespace unless the scope is Global, so that namespaces never share keys
// by accident.
func EngineKeys(dl *locksv1alpha1.DistributedLock) []string {
	out := make([]string, len(dl.Spec.Keys))
	for i, k := range dl.Spec.Keys {
		out[i] = EngineKey(dl.Namespace, dl.Spec.Scope, k)
	}
	return out
}

// EngineKey returns the store-side name of one key.
func EngineKey(namespace string, scope locksv1alpha1.Scope, key string) string {
	if scope == locksv1alpha1.ScopeGlobal {
		return "global/" + key
	}
	return "ns/" + namespace + "/" + key
}
