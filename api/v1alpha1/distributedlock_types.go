package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Scope says how a lock's keys are named in its backend.
// +kubebuilder:validation:Enum=Namespace;Global
type Scope string

const (
	// ScopeNamespace prefixes every key with the lock's namespace, so locks in
	// different namespaces never share a key.
	ScopeNamespace Scope = "Namespace"
	// ScopeGlobal uses the keys as written, so locks in every namespace (and
	// every cluster) that name the same key on the same backend exclude each
	// other. Allowed only where the backend's policy permits it: a
	// ClusterLockBackend's globalScopeNamespaceSelector, or for inline
	// endpoints the operator's configuration.
	ScopeGlobal Scope = "Global"
)

// Contention says what a gated workload does when the lock is held.
// +kubebuilder:validation:Enum=Queue;QueueLatest;ReplaceQueued;CancelInProgress;Skip
type Contention string

const (
	// ContentionQueue makes the workload wait its turn in FIFO order.
	ContentionQueue Contention = "Queue"
	// ContentionQueueLatest makes the workload wait its turn like Queue, but
	// a CronJob keeps only its newest waiting Job: when a newer one joins
	// the queue, the older waiting ones end (Failed, reason Superseded), so a
	// slow holder cannot build a backlog. A Job without a CronJob waits as
	// with Queue.
	ContentionQueueLatest Contention = "QueueLatest"
	// ContentionReplaceQueued makes the workload wait its turn, newest only:
	// when it joins its key's queue, every workload queued there before it
	// (of any CronJob, lock or cluster sharing the key) leaves the queue and
	// ends (a Job Failed, reason Replaced). It is a rule of the store's
	// queue, so it holds across operators and clusters.
	ContentionReplaceQueued Contention = "ReplaceQueued"
	// ContentionCancelInProgress is ReplaceQueued that also stops the
	// running holder, GitHub Actions' cancel-in-progress: when the
	// workload finds its key held by a Job of the same lock, that Job's
	// lease is no longer renewed, the Job ends (Failed, reason Cancelled;
	// its pods stop within their termination grace period) and its lease
	// is released once they have, or expires with the lock's TTL; the
	// newcomer then starts with a larger fencing token. Holders that are
	// not Jobs of the same lock (a manual holder, a hold window, another
	// lock's workload sharing a Global key) are waited for, never
	// stopped. Locks with maxHolders 1 only.
	ContentionCancelInProgress Contention = "CancelInProgress"
	// ContentionSkip makes the workload give up without running: a plain
	// Job ends Failed with reason Skipped; a CronJob's Job is deleted (its
	// run is skipped; Events on the CronJob say why).
	ContentionSkip Contention = "Skip"
)

// OnLost says what happens to a holder whose lease was lost.
// +kubebuilder:validation:Enum=Ignore;Terminate
type OnLost string

const (
	// OnLostIgnore records the loss (Event and condition) and lets the holder run on.
	OnLostIgnore OnLost = "Ignore"
	// OnLostTerminate records the loss and stops the holder's pods.
	OnLostTerminate OnLost = "Terminate"
)

// DistributedLockSpec declares the keys of a lock, its lease TTL and the backend
// that holds it.
// +kubebuilder:validation:XValidation:rule="has(self.keys) != has(self.keyFrom)",message="spec: set exactly one of keys (the lock's fixed keys) or keyFrom (a key derived from each workload's metadata)"
// +kubebuilder:validation:XValidation:rule="has(self.keys) == has(oldSelf.keys) && (!has(self.keys) || self.keys == oldSelf.keys)",message="spec.keys is immutable: create a new DistributedLock to lock other keys"
// +kubebuilder:validation:XValidation:rule="has(self.keyFrom) == has(oldSelf.keyFrom) && (!has(self.keyFrom) || self.keyFrom == oldSelf.keyFrom)",message="spec.keyFrom is immutable: create a new DistributedLock to derive other keys"
// +kubebuilder:validation:XValidation:rule="!has(self.keyFrom) || !has(self.holder)",message="spec.holder needs spec.keys: a lock with keyFrom has no fixed key for a manual holder to hold"
// +kubebuilder:validation:XValidation:rule="!has(self.keyFrom) || !has(self.holds) || size(self.holds) == 0",message="spec.holds needs spec.keys: a lock with keyFrom has no fixed key for a hold to hold"
// +kubebuilder:validation:XValidation:rule="!has(self.maxKeys) || has(self.keyFrom)",message="spec.maxKeys applies only with spec.keyFrom"
// +kubebuilder:validation:XValidation:rule="!has(self.contention) || self.contention != 'CancelInProgress' || !has(self.maxHolders) || self.maxHolders == 1",message="spec.contention CancelInProgress needs maxHolders 1: it stops the one running holder of a key; with several slots use ReplaceQueued"
// +kubebuilder:validation:XValidation:rule="self.scope == oldSelf.scope",message="spec.scope is immutable: create a new DistributedLock to change the scope"
type DistributedLockSpec struct {
	// keys are the lock keys, held all-or-nothing. 1 to 16 unique keys of up
	// to 200 characters: letters, digits and the characters . _ / : - (starting
	// with a letter or digit). Immutable. Exactly one of keys and keyFrom is set.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=200
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9][A-Za-z0-9._/:-]*$`
	Keys []string `json:"keys,omitempty"`

	// keyFrom derives each workload's key from its metadata instead of a
	// fixed list: one lock, many lanes ("one deploy at a time per
	// environment"). The key is computed once, when the Job or Pod is
	// admitted, recorded in its lockwarden.io/key annotation, and kept in the
	// lock's scope (a Namespace lock's keys stay in its namespace whatever
	// the labels say). maxHolders applies per derived key. Immutable.
	// +optional
	KeyFrom *KeyFrom `json:"keyFrom,omitempty"`

	// maxKeys bounds how many derived keys the lock's workloads in this
	// cluster may use at once: a workload that would add one more is refused
	// at admission. Only with keyFrom. Default 100; 1 to 10000.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	MaxKeys int32 `json:"maxKeys,omitempty"`

	// ttlSeconds is the lease TTL in the backend, in seconds. The operator renews a
	// held lease about every ttlSeconds/3, so a holder that dies keeps the keys
	// for at most this long. Default 30; 5 to 86400. The shortest safe TTL
	// is 1.5 × (leader-election lease duration + 2 × retry period), 28.5 s
	// with the default flags: a lease with a shorter TTL may expire during a
	// failover of the operator's leader, and the operator warns about it
	// (Event TTLShorterThanFailover; see docs/operations.md).
	// +optional
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=5
	// +kubebuilder:validation:Maximum=86400
	TTLSeconds int32 `json:"ttlSeconds,omitempty"`

	// scope is Namespace (default: keys are prefixed with the lock's
	// namespace) or Global (keys used as written, shared across namespaces and
	// clusters; allowed only where the backend's policy permits it: a
	// ClusterLockBackend's globalScopeNamespaceSelector, or for inline
	// endpoints the operator's configuration).
	// Immutable.
	// +optional
	// +kubebuilder:default=Namespace
	Scope Scope `json:"scope,omitempty"`

	// maxHolders is how many holders may hold the lock at once: 1 (default)
	// makes it a mutex, N a semaphore with N slots ("at most 3 exports at
	// once"). Each holder gets its own fencing token, strictly increasing
	// across all holders; waiters take free slots in FIFO order. A workload
	// with a lockwarden.io/weight annotation takes that many slots (1 to
	// maxHolders), and the weights held never exceed maxHolders; a heavy
	// waiter at the head of the queue is not passed by lighter ones behind
	// it (strict FIFO), so it starts as soon as enough holders release. 1 to 100.
	// Every store has semaphores. Lowering it never stops a holder: new
	// holders wait until fewer than maxHolders hold.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	MaxHolders int32 `json:"maxHolders,omitempty"`

	// contention is what a gated Job does when the lock is held: Queue (default:
	// wait in FIFO order), QueueLatest (wait, but a CronJob keeps only its
	// newest waiting Job; older ones end with reason Superseded),
	// ReplaceQueued (wait, newest only: a newer Job of the same key replaces
	// the waiting ones, which end with reason Replaced), CancelInProgress
	// (ReplaceQueued that also stops the running Job of the same lock, which
	// ends with reason Cancelled; maxHolders 1 only) or Skip (do not run: a
	// plain Job ends with reason Skipped, a CronJob's Job is deleted). A
	// Job's lockwarden.io/contention annotation overrides it.
	// +optional
	// +kubebuilder:default=Queue
	Contention Contention `json:"contention,omitempty"`

	// priority orders the queue by the workloads' priority, with aging:
	// a workload of higher priority goes ahead of those that arrived less
	// than a share of maxStarvationSeconds before it, so that nothing that
	// arrives later than maxStarvationSeconds after a waiter ever goes ahead
	// of it. A workload's priority is its lockwarden.io/priority annotation
	// (a Job's, else its CronJob's), else its pod's priority (a Job's pod
	// template priorityClassName, resolved at admission; a Pod's or Kueue
	// Workload's spec.priority), else 0. Workloads of equal priority stay in
	// exact FIFO order. Default: none (FIFO for all).
	// +optional
	Priority *Priority `json:"priority,omitempty"`

	// maxWaitSeconds bounds how long a gated Job waits in the queue: past it
	// the Job ends Failed with reason WaitTimedOut (a suspended Job's
	// activeDeadlineSeconds does not count while it waits). A Job's or
	// CronJob's lockwarden.io/max-wait annotation (a duration such as "45m")
	// overrides it. Default: no bound. 1 to 2678400 (31 days).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2678400
	MaxWaitSeconds int32 `json:"maxWaitSeconds,omitempty"`

	// onLost is what happens to a holder whose lease was lost (expired during
	// a backend outage, or taken over): Ignore (default: an Event and a condition
	// say so) or Terminate (also stop the holder's pods).
	// +optional
	// +kubebuilder:default=Ignore
	OnLost OnLost `json:"onLost,omitempty"`

	// holder, when set, makes the operator acquire the lock for this manual
	// holder (a maintenance window, say) and hold it until the field is
	// removed, the lock is deleted, or the hold's until or maxHoldSeconds
	// ends it. Its condition ManualHolderHeld is True only while it holds.
	// Default: none.
	// +optional
	Holder *ManualHolder `json:"holder,omitempty"`

	// holds are recurring windows during which the operator holds the lock
	// itself, as it does for spec.holder: "no deploys 01:00-03:00
	// Europe/Berlin, every day". While a window is open the hold, holder
	// identity hold/<name>, acquires the keys (waiting its turn in the queue
	// behind a holder that holds already), renews them and releases them
	// when the window closes; gated Jobs wait (Queue) or skip (Skip) as for
	// a manual holder. While spec.holder is set it holds instead: a lock has
	// one operator-held holder at a time, and the manual one comes first.
	// At most 8, unique by name.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +listType=map
	// +listMapKey=name
	Holds []RecurringHold `json:"holds,omitempty"`

	// cooldownSeconds keeps the keys held this long after each release by a
	// workload holder (Job, Pod, Kueue Workload) or by spec.holder, so that
	// the next holder starts no sooner ("must not run twice within an
	// hour"). The released lease is renewed once with this TTL and left to
	// expire, with its fencing token, in the store: it holds for every
	// operator and cluster that shares the keys. status.cooldownUntil shows
	// it. A force release ends a cooldown; the end of a hold window and the
	// deletion of the lock do not start one. Default 0 (none); 0 to 86400.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	CooldownSeconds int32 `json:"cooldownSeconds,omitempty"`

	// backend is where the lock lives: inline Redis endpoints, a LockBackend
	// of the lock's namespace, or a ClusterLockBackend, by name (PostgreSQL,
	// ZooKeeper and etcd only through those two).
	// +required
	Backend Backend `json:"backend"`
}

// KeyFrom says how a workload's key is derived. Both expressions are CEL,
// compiled when the lock is admitted and bounded in cost, over these
// variables:
//   - object.metadata: the workload's namespace, name, generateName, labels
//     and annotations (a Job's, or a Pod's);
//   - owner: kind and name of the workload's controller (the CronJob of a
//     Job, the Deployment, StatefulSet or ReplicaSet of a Pod; empty strings
//     when it has none).
type KeyFrom struct {
	// expression gives the key, a string: for example
	// `"deploy/" + object.metadata.labels["env"]`. The result must be a valid
	// key (1 to 200 characters: letters, digits and . _ / : -, starting with
	// a letter or digit); a workload for which it fails (a missing label) or
	// gives no valid key is refused at admission, with the lock, the
	// expression and the error named.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Expression string `json:"expression"`

	// matches, when set, is a CEL guard (a bool) evaluated first: a workload
	// for which it is false is refused at admission, with the guard quoted,
	// for example `"env" in object.metadata.labels &&
	// object.metadata.labels["env"] in ["dev", "staging", "prod"]`.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Matches string `json:"matches,omitempty"`
}

// Priority orders a lock's queue by workload priority, with a bound on how
// far priority can hold a waiter back (aging).
//
// A workload of priority p gets a head start in the queue of
// maxStarvationSeconds × min(p, highest) / highest (none for p ≤ 0): it
// queues as if it had arrived that much earlier. So a waiter is overtaken
// only by workloads of higher priority that arrive less than the
// difference of their head starts after it, and once it has waited
// maxStarvationSeconds, no workload that arrives later goes ahead of it:
// from then on it waits only for those already ahead, as in FIFO order.
type Priority struct {
	// maxStarvationSeconds is the head start of the highest priority, and
	// so the longest a waiter can be passed by workloads that arrive after
	// it. 1 to 86400.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	MaxStarvationSeconds int32 `json:"maxStarvationSeconds"`

	// highest is the priority that gets the whole head start; a priority
	// between 0 and highest gets its share in proportion, a higher one the
	// whole, 0 and below none. For PriorityClass values (often 1000 to
	// 1000000) set it to the class that should go first. Default 1000; 1 to
	// 1000000000.
	// +optional
	// +kubebuilder:default=1000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000000
	Highest int32 `json:"highest,omitempty"`
}

// DefaultPriorityHighest is Priority.Highest when it is not set.
const DefaultPriorityHighest = 1000

// ManualHolder names a holder that is not a Kubernetes workload.
type ManualHolder struct {
	// identity names the holder in status and in the backend, for example
	// "maintenance-2026-12-01". 1 to 128 printable characters, without '/':
	// a workload holder shows as cluster/namespace/Kind/name/uid, and a
	// manual holder cannot pose as one (status.holder.kind and namespace say
	// whose it is).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[[:graph:]]([[:print:]]*[[:graph:]])?$`
	// +kubebuilder:validation:XValidation:rule="!self.contains('/')",message="must not contain '/': workload holders are shown as cluster/namespace/Kind/name/uid and a manual holder may not look like one; use for example maintenance-by-alice"
	Identity string `json:"identity"`

	// until ends the hold at this time (RFC 3339): the operator releases the
	// lease then, records an Event and sets ManualHolderHeld to False with
	// reason HoldEnded. A manual holder whose until has passed does not
	// acquire. Default: no end.
	// +optional
	Until *metav1.Time `json:"until,omitempty"`

	// maxHoldSeconds ends the hold this long after it acquired the lock, like
	// until. Default: no bound. 1 to 2678400 (31 days).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2678400
	MaxHoldSeconds int32 `json:"maxHoldSeconds,omitempty"`
}

// RecurringHold is a window, opened on a cron schedule, during which the
// operator holds the lock.
type RecurringHold struct {
	// name identifies the hold; the holder shows as hold/<name>. 1 to 63
	// lower-case letters, digits and '-'.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// schedule opens a window at each of its times: 5 cron fields (minute
	// hour day-of-month month day-of-week, for example "0 1 * * *" for
	// 01:00 every day) or @hourly, @daily, @weekly, @monthly, @yearly, read
	// in timeZone.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Schedule string `json:"schedule"`

	// durationSeconds is how long each window stays open: 1 to 2678400 (31
	// days), and shorter than the shortest time between two of the
	// schedule's starts, so that windows never overlap.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2678400
	DurationSeconds int32 `json:"durationSeconds"`

	// timeZone is the IANA time zone the schedule is read in, for example
	// Europe/Berlin (daylight saving time included). Default UTC.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	TimeZone string `json:"timeZone,omitempty"`
}

// HoldWindowStatus is one window of a recurring hold.
type HoldWindowStatus struct {
	// name of the hold (spec.holds[].name).
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name,omitempty"`
	// start is when the window opens (opened).
	// +optional
	Start *metav1.Time `json:"start,omitempty"`
	// end is when the window closes.
	// +optional
	End *metav1.Time `json:"end,omitempty"`
}

// Backend selects where a lock lives. Exactly one member is set.
// +kubebuilder:validation:XValidation:rule="[has(self.redis), has(self.clusterBackendRef), has(self.backendRef)].filter(x, x).size() == 1",message="spec.backend: set exactly one of redis (inline endpoints, checked against the operator's endpoint policy), backendRef (a LockBackend in the lock's namespace) or clusterBackendRef (a ClusterLockBackend set up by the cluster's administrators)"
type Backend struct {
	// redis holds the lock in Redis at endpoints this lock names: one server,
	// a Sentinel-managed master, or 3, 5 or 7 independent masters (Redlock).
	// The operator connects only where its endpoint policy allows (see
	// docs/security.md); clusters may turn inline endpoints off.
	// +optional
	Redis *RedisBackend `json:"redis,omitempty"`

	// clusterBackendRef names a ClusterLockBackend: a backend (endpoints,
	// TLS, credentials) that the cluster's administrators set up and allow
	// this lock's namespace to use.
	// +optional
	ClusterBackendRef *ClusterBackendRef `json:"clusterBackendRef,omitempty"`

	// backendRef names a LockBackend in the lock's own namespace: endpoints,
	// TLS and credentials that the namespace's locks share, checked against
	// the operator's endpoint policy like inline endpoints.
	// +optional
	BackendRef *BackendRef `json:"backendRef,omitempty"`
}

// BackendRef names a LockBackend in the lock's namespace.
type BackendRef struct {
	// name of the LockBackend.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
}

// ClusterBackendRef names a ClusterLockBackend.
type ClusterBackendRef struct {
	// name of the ClusterLockBackend.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	Name string `json:"name"`
}

// RedisBackend describes the Redis that holds a lock.
// +kubebuilder:validation:XValidation:rule="has(self.sentinel) || size(self.endpoints) in [1, 3, 5, 7]",message="redis.endpoints must list 1 server (standalone) or 3, 5 or 7 independent masters (Redlock)"
type RedisBackend struct {
	// endpoints are host:port addresses. 1 = a standalone server; 3, 5 or 7 =
	// independent masters for Redlock (never replicas of each other); with
	// sentinel set, 1 to 7 Sentinel addresses.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=7
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=261
	// +kubebuilder:validation:items:Pattern=`^([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$`
	Endpoints []string `json:"endpoints"`

	// sentinel, when set, makes endpoints Redis Sentinels that name the master.
	// +optional
	Sentinel *RedisSentinel `json:"sentinel,omitempty"`

	// db is the Redis database index. Default 0; 0 to 15.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=15
	DB int32 `json:"db,omitempty"`

	// username is the Redis ACL user to authenticate as (AUTH username
	// password, Redis 6 or newer; the master's, not the Sentinels'). Give
	// each namespace's LockBackend a user of its own, limited to the
	// namespace's keys (see docs/security.md, "Tenants on one Redis").
	// Default: Redis's default user.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._@-]+$`
	Username string `json:"username,omitempty"`

	// passwordSecretRef names the key of a Secret that holds the Redis
	// password (AUTH): in the lock's namespace for a DistributedLock, in the
	// operator's namespace for a ClusterLockBackend. Default: no password.
	// +optional
	PasswordSecretRef *SecretKeyRef `json:"passwordSecretRef,omitempty"`

	// tls, when set, connects over TLS. Default: plain TCP.
	// +optional
	TLS *BackendTLS `json:"tls,omitempty"`
}

// RedisSentinel names the master that Sentinels monitor.
type RedisSentinel struct {
	// masterName is the name the Sentinels know the master by. 1 to 128 characters.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	MasterName string `json:"masterName"`

	// passwordSecretRef names the key of a Secret (in the same namespace as
	// the password's) that holds the Sentinels' own password. Default: none.
	// +optional
	PasswordSecretRef *SecretKeyRef `json:"passwordSecretRef,omitempty"`

	// minReplicas is how many replicas must acknowledge every acquisition
	// and renewal (Redis WAIT) before the operator relies on it, so that a
	// failover to one of them keeps the lease. Default 1. 0 turns the wait
	// off: Redis replicates asynchronously, and a failover may then lose the
	// leases written just before it, so that two holders overlap. 0 to 5;
	// at most the replicas the master has, or nothing can be acquired.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=5
	MinReplicas *int32 `json:"minReplicas,omitempty"`
}

// BackendTLS configures TLS to a backend's servers.
type BackendTLS struct {
	// caSecretRef names the key of a Secret (in the same namespace as the
	// password's) that holds the PEM CA bundle to verify the servers with.
	// Default: the system roots.
	// +optional
	CASecretRef *SecretKeyRef `json:"caSecretRef,omitempty"`

	// serverName overrides the name verified in the servers' certificates.
	// Default: the host of each endpoint.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ServerName string `json:"serverName,omitempty"`
}

// SecretKeyRef names one key of a Secret: in the DistributedLock's own
// namespace, or in the operator's namespace for a ClusterLockBackend.
type SecretKeyRef struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// key within the Secret's data.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key"`
}

// HolderStatus says who holds a lock.
type HolderStatus struct {
	// identity is the holder identity stored in the backend: a manual holder's
	// spec.holder.identity, or cluster/namespace/Kind/name/uid-prefix for a Job.
	// Whoever can write the backend chooses these fields: the operator
	// escapes unprintable characters (a line break shows as \n, ESC as \x1b)
	// and cuts each to its maxLength, ending with "...".
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Identity string `json:"identity,omitempty"`
	// cluster is the name of the cluster the holder runs in (the holding
	// operator's --cluster-name), when lockwarden acquired it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Cluster string `json:"cluster,omitempty"`
	// lock is the name of the DistributedLock (in namespace) the holder
	// acquired through; with scope Global it may differ from this lock.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Lock string `json:"lock,omitempty"`
	// kind of the holding Kubernetes object: DistributedLock for a manual
	// holder, Job for a gated Job, Pod for a gated Pod, Deployment,
	// StatefulSet or ReplicaSet for a workload that holds for its Pods.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind,omitempty"`
	// namespace of the holding object.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
	// name of the holding object.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`
	// fencingToken is this holder's fencing token (in status.holders).
	// +optional
	FencingToken int64 `json:"fencingToken,omitempty"`
	// acquiredTime is when this holder acquired the keys (in status.holders).
	// +optional
	AcquiredTime *metav1.Time `json:"acquiredTime,omitempty"`
	// weight is how many of a semaphore's slots this holder takes, when
	// more than one (its lockwarden.io/weight annotation).
	// +optional
	Weight int32 `json:"weight,omitempty"`
}

// WaiterStatus is one entry of the lock's FIFO queue.
type WaiterStatus struct {
	// identity of the waiter, as stored in the backend: escaped and cut as
	// status.holder.identity is.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Identity string `json:"identity,omitempty"`
	// since is when it joined the queue.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
}

// LanesStatus counts the derived keys of a lock with keyFrom.
type LanesStatus struct {
	// keys is how many derived keys this cluster's workloads of the lock use.
	Keys int32 `json:"keys"`
	// holders is how many leases hold those keys (in any cluster).
	Holders int32 `json:"holders"`
	// waiting is how many waiters their queues hold (in any cluster).
	Waiting int32 `json:"waiting"`
	// busiest are the keys with the most holders and waiters (at most 5).
	// +optional
	// +kubebuilder:validation:MaxItems=5
	// +listType=atomic
	Busiest []LaneStatus `json:"busiest,omitempty"`
}

// LaneStatus is one derived key.
type LaneStatus struct {
	// key is the derived key, as the expression gave it.
	Key string `json:"key"`
	// holders is how many leases hold it.
	Holders int32 `json:"holders"`
	// waiting is how many waiters its queue holds.
	Waiting int32 `json:"waiting"`
	// fencingToken is the newest holder's fencing token (0 when free).
	// +optional
	FencingToken int64 `json:"fencingToken,omitempty"`
}

// DistributedLockStatus is what the backend holds for the lock, as last observed.
type DistributedLockStatus struct {
	// holder is who holds the keys now (of a semaphore, the oldest holder);
	// empty when they are free.
	// +optional
	Holder *HolderStatus `json:"holder,omitempty"`

	// holders lists every holder, oldest first, each with its fencing token
	// (at most 10; holderCount is exact).
	// +optional
	// +kubebuilder:validation:MaxItems=10
	// +listType=atomic
	Holders []HolderStatus `json:"holders,omitempty"`

	// holderCount is how many holders hold the keys.
	// +optional
	HolderCount *int32 `json:"holderCount,omitempty"`

	// slots is the slots taken/maxHolders, for example "2/3": each holder
	// takes its weight (1 unless its lockwarden.io/weight says more).
	// +optional
	Slots string `json:"slots,omitempty"`

	// queueLength is the exact number of waiters in the FIFO queue.
	// +optional
	QueueLength *int32 `json:"queueLength,omitempty"`

	// fencingToken is the current holder's fencing token: strictly larger than
	// every token issued before for these keys, below 2^53.
	// +optional
	FencingToken int64 `json:"fencingToken,omitempty"`

	// acquiredTime is when the current holder acquired the keys.
	// +optional
	AcquiredTime *metav1.Time `json:"acquiredTime,omitempty"`

	// expireTime is when the current lease ends unless its holder renews it,
	// as observed at the last change of holder. Empty while a holder of this
	// lock holds it: this operator renews that lease about every
	// ttlSeconds/3, so it has no fixed expiry.
	// +optional
	ExpireTime *metav1.Time `json:"expireTime,omitempty"`

	// lanes summarises a lock with keyFrom: how many derived keys its
	// workloads use, how many hold and wait, and the busiest keys. The
	// holder fields above stay empty for such a lock.
	// +optional
	Lanes *LanesStatus `json:"lanes,omitempty"`

	// waiting is the head of the FIFO queue, oldest first (at most 10).
	// +optional
	// +kubebuilder:validation:MaxItems=10
	// +listType=atomic
	Waiting []WaiterStatus `json:"waiting,omitempty"`

	// activeHold is the window of spec.holds open now, and when it closes.
	// +optional
	ActiveHold *HoldWindowStatus `json:"activeHold,omitempty"`

	// nextHold is the next window of spec.holds to open.
	// +optional
	NextHold *HoldWindowStatus `json:"nextHold,omitempty"`

	// cooldownUntil is when the keys, released by their last holder, come
	// free: they stay held until then for spec.cooldownSeconds.
	// +optional
	CooldownUntil *metav1.Time `json:"cooldownUntil,omitempty"`

	// observedGeneration is the spec generation this status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Held (True while a holder of this lock, its manual holder or
	// one of its Jobs, holds the keys), ManualHolderHeld (True only while
	// spec.holder itself holds: the one to kubectl wait for), HoldActive
	// (with spec.holds: True while a window is open and its hold holds the
	// keys) and BackendReady (the backend answers). See the Reason constants for their reasons.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=dlock;dlocks,categories=lockwarden
// +kubebuilder:printcolumn:name="Keys",type=string,JSONPath=`.spec.keys`
// +kubebuilder:printcolumn:name="Lanes",type=integer,JSONPath=`.status.lanes.keys`,description="Derived keys in use (spec.keyFrom)",priority=1
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.status.holder.identity`
// +kubebuilder:printcolumn:name="Fence",type=integer,JSONPath=`.status.fencingToken`
// +kubebuilder:printcolumn:name="Held",type=string,JSONPath=`.status.conditions[?(@.type=="Held")].reason`
// +kubebuilder:printcolumn:name="Slots",type=string,JSONPath=`.status.slots`,description="Holders now / spec.maxHolders"
// +kubebuilder:printcolumn:name="Queue",type=integer,JSONPath=`.status.queueLength`,description="Waiters in the FIFO queue (exact)"
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.status.expireTime`,description="When another holder's lease ends unless renewed (RFC 3339); empty while this lock's holder holds it and the operator renews it"
// +kubebuilder:printcolumn:name="Backend",type=string,JSONPath=`.status.conditions[?(@.type=="BackendReady")].reason`,priority=1
// +kubebuilder:printcolumn:name="Window",type=string,JSONPath=`.status.activeHold.name`,priority=1,description="The window of spec.holds open now"
// +kubebuilder:printcolumn:name="Window-Ends",type=string,JSONPath=`.status.activeHold.end`,priority=1,description="When the open window closes (RFC 3339)"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// DistributedLock is a lease on one or more keys held in a backend (Redis,
// PostgreSQL, ZooKeeper or etcd). The operator
// shows who holds it, with which fencing token, and who waits.
type DistributedLock struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec declares the lock.
	// +required
	Spec DistributedLockSpec `json:"spec"`

	// status is what the backend holds, as observed by the operator.
	// +optional
	Status DistributedLockStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// DistributedLockList contains a list of DistributedLock.
type DistributedLockList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the locks.
	Items []DistributedLock `json:"items"`
}
