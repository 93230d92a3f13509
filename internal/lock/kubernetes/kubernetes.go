// Package kubernetes is a lock.Locker on the Kubernetes API itself: each
// key is a coordination.k8s.io Lease object in one namespace that only the
// operator writes, so a cluster needs no store of its own to run locks.
//
// The rules:
//   - A key's Lease carries its state in one annotation: the last fencing
//     token issued for the key, its holders and its FIFO queue. Every change
//     is a compare-and-swap on the Lease's resourceVersion, so two writers
//     never both win. The Lease is never deleted by the Locker: the fencing
//     token lives in the same write as the holders and never goes back
//     (leaseTransitions, which restarts when a Lease is recreated, is not
//     used).
//   - A holder does not renew its keys. It points at a session: a Lease of
//     its own per Locker and TTL, and renewing leases is renewing their
//     sessions, one API write per session however many leases it carries.
//     A lease is valid until the start of the session's last renewal (or
//     its acquisition) plus the TTL, less the drift allowance.
//   - A contender never reads another process's clock. It takes a session
//     for expired when the session's resourceVersion has not changed for a
//     whole TTL of its own clock since it first saw that version, and then
//     deletes the session on that version (a precondition) before it removes
//     the session's holders: a renewal that lands first makes the delete
//     fail, and a delete that lands first makes every later renewal fail, so
//     a lease is never renewed after a contender took its keys.
//   - An acquisition of several keys writes them one by one, in the order
//     of their Lease names, and takes them back when a later one is busy.
//     Its fencing token is larger than the last token of every key, checked
//     in each key's own write.
//   - A key held by a semaphore's leases (Request.Limit above 1) admits a
//     request when the slots taken by its live holders, those asked for by
//     the live waiters ranked ahead of it (every live waiter when it is
//     not queued) and its own sum to at most the smallest Limit among its
//     own and its holders': strict FIFO by weight, so a heavy waiter at
//     the head is never passed by lighter ones behind it. Each holding and
//     each waiter keeps its slots (Request.Weight) in the state, written
//     only above 1, and the sum is made on the version of the state that
//     the acquisition's compare-and-swap writes, so two writers never both
//     take the last slots. A holding or waiter without a weight (every one
//     written before Request.Weight) takes one slot, as it did. A Locker
//     that predates Request.Weight counts holders, not slots, and drops
//     the weights of a state it rewrites: weighted requests keep their
//     bound only once every operator writing the namespace knows them.
//   - A key's queue is ordered by rank: the waiter's ticket less its head
//     start (Request.Boost, kept with the waiter), then the ticket and the
//     owner. A ticket is the time the waiter first joined, on its joiner's
//     clock, or else just after the key's last arrival (kept in the state)
//     and every ticket queued, whichever is later: tickets never go back on
//     a key, so equal boosts are served in the order the joins were
//     written, between operators too. The rank is written by the join's
//     compare-and-swap and is the same on every key of a request, so that
//     queues never order two waiters differently. A waiter keeps its place
//     (ticket and boost) by calling again within the waiter TTL.
//   - The clock of a ticket is the joining Locker's (the API server stamps
//     a write to the second at best): a joiner's clock running d behind the
//     others' only makes its ticket the key's last arrival plus 1ns, and one running d
//     ahead moves the key's arrivals d ahead until the others' clocks catch
//     up, so the waiters that join meanwhile seem to have arrived together.
//     Skew thus never breaks FIFO between equal boosts, but shifts what a
//     boost passes by up to the skew: a waiter can be passed by a boost up
//     to the skew shorter than its wait. The last arrival has one copy,
//     in the Lease behind the API server's etcd quorum, like the marks
//     below.
//   - Waiters written before Request.Boost have a ticket only: they rank by
//     it (as if without a boost), and new waiters join after them. A Locker
//     that predates Request.Boost writing a key drops the boosts and the
//     last arrival (the queue is then by ticket again).
//   - The queue rules (Request.Replace and Request.Preempt) live in the same
//     state and are written by the same compare-and-swap as the join or the
//     acquisition that applies them, so they hold between operators. A
//     request with Replace drops from each key's queue the waiters that
//     joined before it (a smaller ticket, whatever their boost; everyone
//     queued when it is not) and lists their owners as
//     replaced until two waiter TTLs of its clock later; a listed owner's
//     calls fail with lock.ErrReplaced. A request with Preempt raises each
//     busy key's preemption mark to the largest token of its other owners'
//     holdings; a holding at or below the mark is not renewed
//     (lock.ErrPreempted), and its owner is refused the key while others
//     wait. The first renewal that finds its lease preempted points the
//     lease's holdings at a session of their own (lw-f-…) that nobody
//     renews, with what their session had left plus the drift allowance as
//     TTL, so that renewing the other leases of the session no longer keeps
//     them and contenders take them once that TTL has passed unchanged
//     (see Locker.freeze). A preempted lease that its holder never renews
//     again stays on its session, and lasts as long as the holder renews
//     that session for other leases, as any lease of the store does.
//   - The marks have one copy, in the Lease, behind the API server's etcd
//     quorum: an operator cut off from it can neither read nor write them,
//     a write from an older version of the state fails its compare-and-swap
//     (so no Locker drops a mark it did not see), and a failover of an API
//     server or etcd member keeps them. They are lost only with the Lease,
//     when etcd is restored from a backup older than them, or when a Locker
//     that predates the rules rewrites the state (it drops the fields it
//     does not know). A replacement mark lapses by the clock of the Locker that
//     prunes it: a clock running up to a waiter TTL ahead of the
//     replacer's still keeps it for the waiter TTL the rule promises.
//
// Owner tokens are stored as SHA-256 digests, never as they are: reading the
// namespace does not let anyone renew or release a lease.
//
// Limits: one cluster only (the API server is the store), and every
// acquisition, release and queue change is an API write; see
// docs/backends.md.
package kubernetes

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeclient "k8s.io/client-go/kubernetes"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// storeName names this store in its *lock.ConfigError.
const storeName = "kubernetes"

const (
	// DefaultPrefix separates the Leases of one lock domain from another's
	// in the same namespace.
	DefaultPrefix = "lockwarden"
	// DefaultOpTimeout bounds each API call.
	DefaultOpTimeout = 5 * time.Second
	// MaxHolders is the largest Request.Limit: every holder of a key is
	// stored in its Lease's annotations, at most 256 KiB in all.
	MaxHolders = 250
	// MaxQueue bounds the waiters of one key, for the same reason.
	MaxQueue = 1000
	// MaxStateBytes bounds a key's state: a write that would make it larger
	// (long holder identities, a long queue) is refused.
	MaxStateBytes = 200 << 10
	// MaxScopes bounds Config.Scopes.
	MaxScopes = 8
)

// Labels and annotations of the Leases.
const (
	// LabelStore selects the Leases of one prefix: a digest of it.
	LabelStore = "lockwarden.io/lock-store"
	// LabelRole tells key Leases ("key") from sessions ("session").
	LabelRole = "lockwarden.io/lock-role"
	// AnnotationState holds a key's state (JSON).
	AnnotationState = "lockwarden.io/lock-state"
	// AnnotationTTL is a session's TTL in milliseconds.
	AnnotationTTL = "lockwarden.io/session-ttl-ms"

	roleKey     = "key"
	roleSession = "session"
)

// Config is where the Leases live.
type Config struct {
	// Client reaches the API server with the operator's identity.
	Client kubeclient.Interface
	// Namespace holds the Leases: one that only the operator may write.
	Namespace string
	// Prefix separates lock domains within the namespace. Default
	// DefaultPrefix.
	Prefix string
	// Identity is written as the holderIdentity of the Locker's sessions,
	// for people reading them (for example the Pod name). Optional.
	Identity string
	// Scopes, when set, are the only key prefixes the Locker's keys may
	// start with (the scopes of a namespace's backend).
	Scopes []string
}

// Validate says what is wrong with c (a *lock.ConfigError), or nil.
func (c *Config) Validate() error {
	if c.Client == nil {
		return &lock.ConfigError{Store: storeName, Field: "Client", Reason: "a client of the API server is required"}
	}
	if errs := validation.IsDNS1123Label(c.Namespace); len(errs) > 0 {
		return &lock.ConfigError{Store: storeName, Field: "Namespace", Reason: fmt.Sprintf("%q is not a namespace name: %s", c.Namespace, strings.Join(errs, "; "))}
	}
	if strings.ContainsFunc(c.Prefix, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return &lock.ConfigError{Store: storeName, Field: "Prefix", Reason: "control characters are not allowed"}
	}
	if len(c.Scopes) > MaxScopes {
		return &lock.ConfigError{Store: storeName, Field: "Scopes", Reason: fmt.Sprintf("%d scopes given, at most %d", len(c.Scopes), MaxScopes)}
	}
	for i, s := range c.Scopes {
		if s == "" {
			return &lock.ConfigError{Store: storeName, Field: fmt.Sprintf("Scopes[%d]", i), Reason: "a scope must not be empty; leave Scopes empty to allow every key"}
		}
	}
	return nil
}

// Option configures a Locker.
type Option func(*options)

type options struct {
	lock.Options
	opTimeout time.Duration
	// earlyExpiry is a mutant for the fault suite's negative control (set
	// by tests only): contenders take a session for expired this much
	// before a whole TTL has passed.
	earlyExpiry time.Duration
	// collectEvery is how often the Locker looks for the sessions of
	// processes that are gone (DefaultCollectEvery; tests shorten it).
	collectEvery time.Duration
}

// DefaultCollectEvery is how often a Locker lists the store's sessions to
// delete those nobody renews any more (a crashed or replaced operator's),
// from its calls to TryAcquire, Acquire and RenewAll.
const DefaultCollectEvery = 10 * time.Minute

// WithClock sets the Locker's clock: it times leases (Acquired, Expires),
// how long a contender has seen a session unchanged, and Acquire's waits.
// Default: the real clock.
func WithClock(c clock.PassiveClock) Option { return func(o *options) { o.Clock = c } }

// WithLogger sets the logger. Default: logr.Discard().
func WithLogger(l logr.Logger) Option { return func(o *options) { o.Log = l } }

// WithBackoff sets Acquire's fallback polling between attempts when no
// watch event wakes it. Default: lock.DefaultBackoff.
func WithBackoff(b wait.Backoff) Option { return func(o *options) { o.Backoff = b } }

// WithWaiterTTL sets how long a waiter keeps its place in a key's queue
// without calling again. Default: lock.DefaultWaiterTTL.
func WithWaiterTTL(d time.Duration) Option { return func(o *options) { o.WaiterTTL = d } }

// WithOpTimeout bounds each API call. Default: DefaultOpTimeout.
func WithOpTimeout(d time.Duration) Option { return func(o *options) { o.opTimeout = d } }

// Locker is a lock.Locker on Lease objects. Every method is safe for
// concurrent use.
type Locker struct {
	cfg    Config
	opts   options
	leases coordclient.LeaseInterface
	// store is the LabelStore value of this prefix.
	store                            string
	lock.Acquisitions[time.Duration] // TryAcquire and Acquire, over attempt and wait

	// smu serializes the writes of the Locker's sessions.
	smu sync.Mutex
	// mu guards what follows, and the fields of the sessions.
	mu sync.Mutex
	// sessions are this Locker's own (and those it took over to renew the
	// leases of another Locker), by name; current is the one new leases
	// of each TTL join.
	sessions map[string]*session
	current  map[time.Duration]*session
	// seen is, for each session this Locker has read, the version it last
	// saw and when it first saw that version (its own clock).
	seen map[string]sighting
	// orphans are holdings this Locker wrote for acquisitions that failed
	// and could not take back; they are released at the next chance.
	orphans []orphan
	// collected is when the Locker last looked for dead sessions; collecting
	// is set while it does.
	collected  time.Time
	collecting bool

	closed    chan struct{}
	closeOnce sync.Once
}

// sighting is the version of a session a Locker last read, and when.
type sighting struct {
	version string
	since   time.Time
}

// orphan is a holding to take back.
type orphan struct {
	key   string
	owner string // digest
	fence int64
}

var (
	_ lock.Locker         = (*Locker)(nil)
	_ lock.BatchInspector = (*Locker)(nil)
)

// New returns a Locker on cfg's namespace. The error is a *lock.ConfigError
// naming what is wrong.
func New(cfg Config, opts ...Option) (*Locker, error) {
	o := options{Options: lock.DefaultOptions(), opTimeout: DefaultOpTimeout, collectEvery: DefaultCollectEvery}
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.Validate(storeName); err != nil {
		return nil, err
	}
	if o.opTimeout <= 0 {
		return nil, &lock.ConfigError{Store: storeName, Field: "WithOpTimeout", Reason: fmt.Sprintf("%v: must be positive", o.opTimeout)}
	}
	o.CleanupTimeout = o.opTimeout
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(cfg.Prefix))
	l := &Locker{
		cfg:      cfg,
		opts:     o,
		leases:   cfg.Client.CoordinationV1().Leases(cfg.Namespace),
		store:    hex.EncodeToString(sum[:10]),
		sessions: map[string]*session{},
		current:  map[time.Duration]*session{},
		seen:     map[string]sighting{},
		closed:   make(chan struct{}),
	}
	l.Acquisitions = lock.Acquisitions[time.Duration]{Check: l.check, Attempt: l.attempt, Wait: l.wait, Weights: true}
	return l, nil
}

// ErrClosed is wrapped, with lock.ErrBackendUnavailable, by the errors of a
// Locker's calls after Close.
var ErrClosed = errors.New("the kubernetes Locker is closed")

// Close ends the Locker's watches. Its leases stay held until released or
// until their sessions, no longer renewed, expire.
func (l *Locker) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

// checkOpen fails once the Locker is closed.
func (l *Locker) checkOpen(op string) error {
	select {
	case <-l.closed:
		return fmt.Errorf("%s: %w: %w", op, lock.ErrBackendUnavailable, ErrClosed)
	default:
		return nil
	}
}

// drift is the clock drift allowance of a lease of the given TTL, the one
// every store subtracts: 1% of the TTL plus 2ms.
func drift(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// validUntil is the Expires of a lease whose session was written by a call
// that started at start.
func validUntil(start time.Time, ttl time.Duration) time.Time {
	return start.Add(ttl - drift(ttl))
}

// digest is what a key's state stores of an owner token.
func digest(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(sum[:16])
}

// leaseName is the name of key's Lease.
func (l *Locker) leaseName(key string) string {
	sum := sha256.Sum256([]byte(l.cfg.Prefix + "\x00" + key))
	return "lw-" + hex.EncodeToString(sum[:20])
}

// checkScopes refuses keys outside the Locker's scopes.
func (l *Locker) checkScopes(field string, keys []string) error {
	if len(l.cfg.Scopes) == 0 {
		return nil
	}
	for i, k := range keys {
		if !slices.ContainsFunc(l.cfg.Scopes, func(s string) bool { return strings.HasPrefix(k, s) }) {
			return &lock.InvalidRequestError{Field: fmt.Sprintf("%s[%d]", field, i), Reason: fmt.Sprintf("key %q is outside this backend's scopes %q", k, l.cfg.Scopes)}
		}
	}
	return nil
}

// callCtx bounds one API call.
func (l *Locker) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, l.opts.opTimeout)
}

// apiError turns a failed API call into the store's error: the API server
// did not answer or refused (lock.ErrBackendUnavailable).
func apiError(op string, err error) error {
	var ne net.Error
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %w: the operator may not write Leases here (its RBAC): %w", op, lock.ErrBackendUnavailable, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne):
		return fmt.Errorf("%s: %w: the API server did not answer: %w", op, lock.ErrBackendUnavailable, err)
	}
	return fmt.Errorf("%s: %w: %w", op, lock.ErrBackendUnavailable, err)
}

// state is what a key's Lease holds.
type state struct {
	// Key is the key as requested.
	Key string `json:"key"`
	// Fence is the last fencing token issued for the key.
	Fence int64 `json:"fence"`
	// Holders are the leases holding it, oldest first, each with the
	// slots it takes (holding.Weight).
	Holders []holding `json:"holders,omitempty"`
	// Queue is its queue, by rank (see waiterOrder), each waiter with the
	// slots it asks for (waiter.Weight).
	Queue []waiter `json:"queue,omitempty"`
	// Arrival is the largest ticket a waiter joined the queue with, so
	// that tickets never go back (see arrival). Absent from states written
	// before Request.Boost.
	Arrival int64 `json:"arrival,omitempty"`
	// Replaced are the owners a request with Replace dropped from the
	// queue: their calls are told so (lock.ErrReplaced) until the mark's
	// Until. Absent from states written before Request.Replace.
	Replaced []mark `json:"replaced,omitempty"`
	// Preempted is the largest fencing token a request with Preempt
	// stopped: a holding with a token up to it is no longer renewed.
	// Tokens only grow, so leases taken later are not affected. Absent
	// (0: none) from states written before Request.Preempt.
	Preempted int64 `json:"preempted,omitempty"`
}

// mark is an owner dropped from a key's queue by a newer request.
type mark struct {
	Owner string `json:"owner"` // digest
	// Until is when the mark lapses (Unix ms, the replacing request's
	// clock, like a waiter's Until).
	Until int64 `json:"until"`
}

// replacedMark tells whether st marks owner replaced.
func (st *state) replacedMark(owner string) bool {
	return slices.ContainsFunc(st.Replaced, func(m mark) bool { return m.Owner == owner })
}

// preempts tells whether h is a holding a request with Preempt stopped.
func (st *state) preempts(h holding) bool { return h.Fence <= st.Preempted }

// holding is one lease on a key.
type holding struct {
	Owner   string `json:"owner"` // digest
	Holder  string `json:"holder,omitempty"`
	Fence   int64  `json:"fence"`
	Limit   int    `json:"limit"`
	Session string `json:"session"`
	// Acquired is when the lease was acquired (Unix ms, the acquirer's clock).
	Acquired int64 `json:"acquired"`
	// Weight is the slots of the semaphore it takes (Request.Weight),
	// written only above 1: absent (0) reads as one slot, as in the
	// states written before Request.Weight and in a mutex's holdings.
	Weight int `json:"weight,omitempty"`
}

func (h holding) mutex() bool { return h.Limit <= 1 }

// slots is the number of slots h takes (its Weight, at least 1).
func (h holding) slots() int { return max(h.Weight, 1) }

// storedWeight is what a holding or a waiter keeps of req's weight: its
// slots above 1, else nothing (0, omitted), so that the state of an
// unweighted request is written as before Request.Weight.
func storedWeight(req lock.Request) int {
	if w := req.Slots(); w > 1 {
		return w
	}
	return 0
}

// waiter is one place in a key's queue.
type waiter struct {
	Owner  string `json:"owner"` // digest
	Holder string `json:"holder,omitempty"`
	// Ticket is when the waiter first joined (Unix ns, its own clock, and
	// after the key's last arrival), the same on every key of its request.
	Ticket int64 `json:"ticket"`
	// Boost is its head start (Request.Boost, µs): the queue is ordered by
	// rank, Ticket less Boost. Absent (0) without a boost, and from
	// states written before Request.Boost.
	Boost int64 `json:"boost,omitempty"`
	// Since is when it joined this key's queue; Until when it loses its
	// place unless it calls again (Unix ms, its own clock).
	Since int64 `json:"since"`
	Until int64 `json:"until"`
	// Weight is the slots it asks for (Request.Weight), written only
	// above 1: absent (0) reads as one slot, as in the states written
	// before Request.Weight.
	Weight int `json:"weight,omitempty"`
}

// slots is the number of slots w asks for (its Weight, at least 1).
func (w waiter) slots() int { return max(w.Weight, 1) }

// rank orders a key's queue: the waiter's arrival less its head start
// (Unix ns). A waiter written before Request.Boost ranks by its ticket.
func (w waiter) rank() int64 { return w.Ticket - w.Boost*int64(time.Microsecond) }

// keyLease is a key's Lease as read: obj nil when it does not exist yet.
type keyLease struct {
	key string
	obj *coordinationv1.Lease
	st  state
}

// decode reads a key's state from its Lease.
func decode(key string, obj *coordinationv1.Lease) (state, error) {
	raw, ok := obj.Annotations[AnnotationState]
	if !ok {
		return state{Key: key}, nil
	}
	var st state
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return st, fmt.Errorf("the Lease %s holds no valid lock state (annotation %s): %w", obj.Name, AnnotationState, err)
	}
	if st.Key != key {
		return st, fmt.Errorf("the Lease %s holds the state of key %q, not of %q", obj.Name, st.Key, key)
	}
	return st, nil
}

// get reads the Leases of keys, in order.
func (l *Locker) get(ctx context.Context, op string, keys []string) ([]*keyLease, error) {
	out := make([]*keyLease, len(keys))
	for i, k := range keys {
		kl, err := l.getOne(ctx, op, k)
		if err != nil {
			return nil, err
		}
		out[i] = kl
	}
	return out, nil
}

func (l *Locker) getOne(ctx context.Context, op, key string) (*keyLease, error) {
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	obj, err := l.leases.Get(cctx, l.leaseName(key), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return &keyLease{key: key, st: state{Key: key}}, nil
	case err != nil:
		return nil, apiError(op, err)
	}
	st, err := decode(key, obj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", op, lock.ErrBackendUnavailable, err)
	}
	return &keyLease{key: key, obj: obj, st: st}, nil
}

// errConflict says a compare-and-swap lost: the Lease changed since it was read.
var errConflict = errors.New("the Lease changed since it was read")

// put writes kl's state (creating its Lease when it has none) on the
// version it was read at; errConflict when that version is gone.
func (l *Locker) put(ctx context.Context, op string, kl *keyLease) error {
	raw, err := json.Marshal(kl.st)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if len(raw) > MaxStateBytes {
		return fmt.Errorf("%s: %w: key %q would need %d bytes for its %d holders and %d waiters, more than the %d a Lease may keep", op, lock.ErrNotAcquired, kl.key, len(raw), len(kl.st.Holders), len(kl.st.Queue), MaxStateBytes)
	}
	var obj *coordinationv1.Lease
	if kl.obj == nil {
		obj = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Name:   l.leaseName(kl.key),
			Labels: map[string]string{LabelStore: l.store, LabelRole: roleKey, "app.kubernetes.io/managed-by": "lockwarden"},
		}}
	} else {
		obj = kl.obj.DeepCopy()
	}
	if obj.Annotations == nil {
		obj.Annotations = map[string]string{}
	}
	obj.Annotations[AnnotationState] = string(raw)
	// The spec shows the first holder to people reading the Lease.
	obj.Spec = coordinationv1.LeaseSpec{}
	if len(kl.st.Holders) > 0 {
		h := kl.st.Holders[0]
		who := h.Holder
		if who == "" {
			who = "fence " + fmt.Sprint(h.Fence)
		}
		obj.Spec.HolderIdentity = &who
		at := metav1.NewMicroTime(time.UnixMilli(h.Acquired))
		obj.Spec.AcquireTime = &at
	}
	cctx, cancel := l.callCtx(ctx)
	defer cancel()
	var out *coordinationv1.Lease
	if kl.obj == nil {
		out, err = l.leases.Create(cctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return errConflict
		}
	} else {
		out, err = l.leases.Update(cctx, obj, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return errConflict
		}
	}
	if err != nil {
		return apiError(op, err)
	}
	kl.obj = out
	return nil
}

// newName returns a random session name.
func newName() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "lw-s-" + hex.EncodeToString(b[:])
}
