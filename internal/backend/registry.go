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
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/holder"
	"github.com/lockwarden/lockwarden/internal/lock"
)

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
	// cluster is where the operator runs, for stores kept in the cluster
	// itself (SetCluster).
	cluster Cluster

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

// Cluster is the cluster the operator runs in, for a store that keeps its
// locks in the cluster itself rather than on a server of its own.
type Cluster struct {
	// Config reaches the API server with the operator's identity.
	Config *rest.Config
	// Namespace is the operator's namespace, which only it writes.
	Namespace string
	// Identity names this replica to people reading what it wrote (its
	// Pod's name).
	Identity string
}

// SetCluster tells the registry, before first use, the cluster the
// operator runs in; without it, stores kept in the cluster are refused.
func (r *Registry) SetCluster(c Cluster) { r.cluster = c }

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
