package v1alpha1

// This file is lockwarden's user-facing contract: every annotation, label,
// environment variable, finalizer, condition and Event reason that users (and
// their tooling: kubectl wait, alerts, admission policies, workloads) match
// on. The operator's packages take these names from here and nowhere else.

// Annotations and labels on gated Jobs and CronJobs.
const (
	// AnnotationLock names the DistributedLock (in the same namespace) that
	// gates a Job, a CronJob or a CronJob's job template. Users set it.
	AnnotationLock = "lockwarden.io/lock"
	// AnnotationContention overrides the lock's spec.contention for one Job
	// or CronJob: Queue, QueueLatest, ReplaceQueued, CancelInProgress or
	// Skip. Users set it.
	AnnotationContention = "lockwarden.io/contention"
	// AnnotationPriority is a workload's priority in the queue of a lock
	// with spec.priority: an integer, higher first (-2147483648 to
	// 2147483647). On a Job, a CronJob (copied to its Jobs) or a Pod. Users
	// set it; on a Job without one whose pod template names a
	// priorityClassName, the admission webhook sets it to that class's
	// value.
	AnnotationPriority = "lockwarden.io/priority"
	// AnnotationWeight is how many slots of a semaphore (a lock with
	// maxHolders above 1) a workload takes: an integer from 1 to the lock's
	// maxHolders; default 1. On a Job, a CronJob (copied to its Jobs) or a
	// Pod. Users set it.
	AnnotationWeight = "lockwarden.io/weight"
	// AnnotationKey is the key a workload of a lock with spec.keyFrom was
	// given at admission (as the expression gave it, before the scope
	// prefix). Only the operator's webhook writes it.
	AnnotationKey = "lockwarden.io/key"
	// LabelLock marks a Job the admission webhook gated, with the name of its
	// lock; the operator watches only Jobs with this label.
	LabelLock = "lockwarden.io/lock"
	// AnnotationFencingToken carries the holder's fencing token, on the Job
	// and on its pod template (from where EnvFencingToken reads it).
	AnnotationFencingToken = "lockwarden.io/fencing-token" //nolint:gosec // G101: an annotation name, not a credential
	// AnnotationHolder carries the holder identity, on the Job and its pod template.
	AnnotationHolder = "lockwarden.io/holder"
	// AnnotationLost records on a Job that its lease was lost, when and why.
	AnnotationLost = "lockwarden.io/lost"
	// AnnotationSkipped records on a Job that it did not run because the lock
	// was held and its contention is Skip.
	AnnotationSkipped = "lockwarden.io/skipped"
	// AnnotationMaxWait overrides the lock's spec.maxWaitSeconds for one Job
	// or CronJob: a duration such as "45m" or "2h". Users set it.
	AnnotationMaxWait = "lockwarden.io/max-wait"
	// AnnotationQueuePosition shows on a waiting Job its place in the lock's
	// queue as "position/length" (1 = next), for example "3/7". The operator sets it.
	AnnotationQueuePosition = "lockwarden.io/queue-position"
	// AnnotationWaitingFor shows on a waiting Job whom it waits behind (the
	// current holder, or the waiters ahead). The operator sets it.
	AnnotationWaitingFor = "lockwarden.io/waiting-for"
	// AnnotationSyncedFromCronJob marks job-template annotations that the
	// operator copied from the CronJob's own annotations, so that they are
	// removed with them.
	AnnotationSyncedFromCronJob = "lockwarden.io/synced-from-cronjob"
)

// Pod gating: Pods of Deployments, StatefulSets and ReplicaSets, and bare
// Pods, that name a lock (AnnotationLock on the Pod, from its template; the
// workload webhook copies a Deployment's or StatefulSet's own annotation
// into its template) wait with a scheduling gate until they hold it.
const (
	// AnnotationHolderMode says who holds the lock for a gated Pod:
	// HolderModePod (the default) or HolderModeWorkload.
	AnnotationHolderMode = "lockwarden.io/holder-mode"
	// AnnotationWorkload is set by the Pod webhook on a gated Pod to its
	// controlling workload, Kind/name/uid (a Deployment is found through
	// the Pod's ReplicaSet); empty for a bare Pod. Only lockwarden writes it.
	AnnotationWorkload = "lockwarden.io/workload"
	// AnnotationHandover set to HandoverTerminating makes a gated Pod
	// release its lease as soon as it starts terminating, rather than when
	// it is gone: the next Pod runs during the old one's grace period, with
	// a larger fencing token.
	AnnotationHandover = "lockwarden.io/handover"
	// HandoverTerminating is the value of AnnotationHandover that releases
	// at the start of termination.
	HandoverTerminating = "Terminating"
	// SchedulingGate is the name of the scheduling gate that keeps a gated
	// Pod Pending until it holds its lock.
	SchedulingGate = "lockwarden.io/lock"
	// PodConditionLockHeld is the Pod condition lockwarden sets to False
	// when a running Pod's lease is lost.
	PodConditionLockHeld = "lockwarden.io/LockHeld"
	// AnnotationSyncedFromWorkload marks pod-template annotations that the
	// workload webhook copied from a Deployment's or StatefulSet's own
	// annotations (a comma-separated list of their names).
	AnnotationSyncedFromWorkload = "lockwarden.io/synced-from-workload"
)

// HolderMode says who holds the lock for the gated Pods of a workload.
type HolderMode string

const (
	// HolderModePod: each Pod holds the lock for itself, so a lock's
	// maxHolders caps the running Pods (across namespaces and clusters
	// sharing the store). The default.
	HolderModePod HolderMode = "Pod"
	// HolderModeWorkload: the Pod's Deployment, StatefulSet or ReplicaSet
	// holds the lock once for all its Pods in this cluster; in another
	// cluster sharing the store the same workload waits (active/passive).
	HolderModeWorkload HolderMode = "Workload"
)

// ConditionRolloutBlocked is a DistributedLock's condition: True while a
// Deployment's rolling update waits for this lock that only its own old
// Pods hold and will not give up (maxUnavailable 0).
const ConditionRolloutBlocked = "RolloutBlocked"

// ReasonNoBlockedRollout: RolloutBlocked is False, no rollout waits any more.
const ReasonNoBlockedRollout = "NoBlockedRollout"

// EventRolloutBlocked is recorded on the lock and the Deployment when
// ConditionRolloutBlocked becomes True.
const EventRolloutBlocked = "RolloutBlocked"

// Annotations on DistributedLocks.
const (
	// AnnotationForceRelease asks the operator to take a lease away from a
	// holder of this lock: its value is the holder's fencing token (as
	// status.holders shows it). Anyone who may update the lock may ask; the
	// admission webhook records who in AnnotationForceReleaseBy (sealed by
	// AnnotationForceReleaseSeal), the operator releases the lease, records
	// Event ForceReleased (who, which holder, which token) and removes the
	// annotations. The holder is
	// treated as having lost its lease (the lock's onLost applies). Only
	// holders that acquired through this lock, in this cluster, can be
	// released this way.
	AnnotationForceRelease = "lockwarden.io/force-release"
	// AnnotationForceReleaseBy is set by the admission webhook to the user
	// who set AnnotationForceRelease; a value set by anyone else is replaced
	// or removed.
	AnnotationForceReleaseBy = "lockwarden.io/force-release-by"
	// AnnotationForceReleaseSeal is set by the admission webhook beside
	// AnnotationForceReleaseBy: an HMAC of the lock, the token and the user
	// under a key only the operator holds. The operator carries out a
	// request only when the seal matches, so a record written where the
	// webhook does not run names nobody.
	AnnotationForceReleaseSeal = "lockwarden.io/force-release-seal"
)

// Finalizer keeps every DistributedLock until its manual holder's lease (if
// any) is released and its queue entries are gone, and a gated Job until its
// lease is released.
const Finalizer = "locks.lockwarden.io/release"

// Environment variables the admission webhook adds to every container of a gated Job.
const (
	// EnvFencingToken hands the fencing token to the workload (from the pod
	// template's AnnotationFencingToken, through the downward API).
	EnvFencingToken = "LOCKWARDEN_FENCING_TOKEN" //nolint:gosec // G101: an environment variable name, not a credential
	// EnvHolder is the holder identity (from AnnotationHolder).
	EnvHolder = "LOCKWARDEN_HOLDER"
	// EnvLock is the name of the DistributedLock.
	EnvLock = "LOCKWARDEN_LOCK"
)

// Condition types.
const (
	// ConditionHeld is True while a holder of this lock holds its keys.
	ConditionHeld = "Held"
	// ConditionBackendReady is True while the lock's backend (Redis, PostgreSQL, ZooKeeper or etcd) answers.
	ConditionBackendReady = "BackendReady"
)

// ConditionManualHolderHeld is True only while a lock's spec.holder itself
// holds the keys (not while one of its Jobs does): kubectl wait
// --for=condition=ManualHolderHeld waits for the maintenance window to start.
const ConditionManualHolderHeld = "ManualHolderHeld"

// Reasons of the ManualHolderHeld condition (besides ReasonAcquired,
// ReasonWaiting, ReasonLost and the backend reasons of Held).
const (
	// ReasonNoManualHolder: spec.holder is not set.
	ReasonNoManualHolder = "NoManualHolder"
	// ReasonHoldEnded: the manual holder's until or maxHoldSeconds passed; its lease was released.
	ReasonHoldEnded = "HoldEnded"
)

// ConditionHoldActive is a lock's condition while it has spec.holds: True
// while a window is open and its hold holds the keys. It is a condition of
// its own, not ManualHolderHeld, because kubectl wait
// --for=condition=ManualHolderHeld waits for spec.holder, which a recurring
// window must not satisfy.
const ConditionHoldActive = "HoldActive"

// Reasons of the HoldActive condition (besides ReasonAcquired, ReasonWaiting
// and the backend reasons of Held).
const (
	// ReasonNoWindowOpen: no window of spec.holds is open now.
	ReasonNoWindowOpen = "NoWindowOpen"
	// ReasonManualHolderFirst: a window is open, but spec.holder is set and
	// holds instead.
	ReasonManualHolderFirst = "ManualHolderFirst"
	// ReasonInvalidHold: a hold cannot be read (admitted where the
	// admission webhook did not check it).
	ReasonInvalidHold = "InvalidHold"
	// ReasonCooldown: the Held condition's reason while the keys stay held
	// for spec.cooldownSeconds after a release.
	ReasonCooldown = "Cooldown"
)

// Reasons a gated Job ends Failed (its FailureTarget and Failed conditions):
// without running, or deleted while it ran.
const (
	// JobReasonSkipped: the lock was held and the Job's contention is Skip.
	JobReasonSkipped = "Skipped"
	// JobReasonWaitTimedOut: the Job waited longer than its maximum wait.
	JobReasonWaitTimedOut = "WaitTimedOut"
	// JobReasonSuperseded: a newer Job of the same CronJob joined the queue
	// and the contention is QueueLatest.
	JobReasonSuperseded = "Superseded"
	// JobReasonReplaced: a newer workload joined the queue of the Job's key
	// and the contention is ReplaceQueued or CancelInProgress.
	JobReasonReplaced = "Replaced"
	// JobReasonCancelled: the Job held its key when a newer Job of the same
	// lock with contention CancelInProgress asked for it; its pods are
	// stopped (the Job controller turns the condition into Failed), and the
	// lock is released once they have.
	JobReasonCancelled = "Cancelled"
	// JobReasonDeleted: the Job was deleted while it held its lock; its pods
	// are stopped (the Job controller turns the condition into Failed), and
	// the lock is released once they have.
	JobReasonDeleted = "DeletedWhileHolding"
)

// ConditionReady is the condition of a ClusterLockBackend: True while the
// client its locks share answers.
const ConditionReady = "Ready"

// ReasonNotInUse: no lock uses the ClusterLockBackend, so the operator has no
// client to check it with (Ready is Unknown).
const ReasonNotInUse = "NotInUse"

// ConditionStoreConfigured is a ClusterLockBackend's or LockBackend's
// condition for the stores whose server settings the operator reads (Redis:
// maxmemory-policy on every node): False while a server has a setting that
// makes leases unsafe, True when the last check found none. A server that
// does not let the operator read its settings counts as none found. Absent
// for the other stores, and while no lock uses the backend.
const ConditionStoreConfigured = "StoreConfigured"

// Reasons of the StoreConfigured condition, also of the Events recorded on
// the backend when it changes (a Warning per unsafe setting found, a Normal
// Event when none is left).
const (
	// ReasonUnsafeSetting: a server has a setting that makes leases unsafe;
	// the message names the server, the setting, the value found and the fix.
	ReasonUnsafeSetting = "UnsafeSetting"
	// ReasonNoUnsafeSetting: the last check found no unsafe setting.
	ReasonNoUnsafeSetting = "NoUnsafeSetting"
)

// Reasons of the Held condition.
const (
	// ReasonAcquired: a holder of this lock (its manual holder or one of its Jobs) holds the keys.
	ReasonAcquired = "Acquired"
	// ReasonWaiting: this lock's holder waits in the FIFO queue for the current holder.
	ReasonWaiting = "Waiting"
	// ReasonHeldByOther: the keys are held by a holder that did not acquire
	// through this lock (another lock with scope Global, or another cluster).
	ReasonHeldByOther = "HeldByOther"
	// ReasonFree: nobody holds the keys.
	ReasonFree = "Free"
	// ReasonLost: this lock's holder lost its lease (it expired during a
	// backend outage, or was taken over).
	ReasonLost = "Lost"
	// ReasonScopeNotAllowed: scope Global is not allowed in this namespace,
	// or not for one of the lock's keys (a ClusterLockBackend's
	// globalKeyPrefixes).
	ReasonScopeNotAllowed = "ScopeNotAllowed"
	// ReasonBackendUnavailable: the backend did not answer, so who holds the keys is unknown.
	ReasonBackendUnavailable = "BackendUnavailable"
)

// Reasons of the BackendReady condition.
const (
	// ReasonBackendReachable: the backend answered (for Redlock, a majority of its masters).
	ReasonBackendReachable = "Reachable"
	// ReasonBackendUnreachable: the backend could not be reached or did not answer in time.
	ReasonBackendUnreachable = "Unreachable"
	// ReasonSecretNotFound: a Secret or key named by the backend is missing,
	// cannot be read, or holds a value over its size limit.
	ReasonSecretNotFound = "SecretNotFound"
	// ReasonInvalidBackend: the backend configuration cannot be used (for example a bad CA).
	ReasonInvalidBackend = "InvalidBackend"
	// ReasonBackendNotFound: the ClusterLockBackend that spec.backend.clusterBackendRef names does not exist.
	ReasonBackendNotFound = "BackendNotFound"
	// ReasonBackendNotAllowed: the lock may not use its backend: the
	// ClusterLockBackend does not select the lock's namespace, inline
	// endpoints are turned off, or an endpoint is outside the operator's
	// endpoint policy. No connection is made.
	ReasonBackendNotAllowed = "BackendNotAllowed"
	// ReasonConnecting: the backend is new and its first health check has
	// not answered yet.
	ReasonConnecting = "Connecting"
)

// Reasons of the Events the operator records on DistributedLocks, Jobs and CronJobs.
const (
	// EventAcquired: a holder acquired the lock (on the lock, and on the Job).
	EventAcquired = "Acquired"
	// EventReleased: a holder released the lock.
	EventReleased = "Released"
	// EventLost: a holder's lease was lost (it expired or was taken over).
	EventLost = "Lost"
	// EventBackendUnavailable: the lock's backend did not answer or cannot be used.
	EventBackendUnavailable = "BackendUnavailable"
	// EventScopeNotAllowed: scope Global is not allowed in the lock's
	// namespace (on the lock, and on each of its Jobs that therefore waits).
	EventScopeNotAllowed = "ScopeNotAllowed"
	// EventBackendNotAllowed: the lock may not use its backend (see
	// ReasonBackendNotAllowed), on the lock and on each of its Jobs.
	EventBackendNotAllowed = "BackendNotAllowed"
	// EventOrphanReleased: a lease whose holder is gone or no longer gated
	// (its Job or lock was deleted, or its finalizer or label removed) was
	// released.
	EventOrphanReleased = "OrphanReleased"
	// EventTampered: a gated Job's lockwarden annotations were changed by
	// someone other than the operator and were restored.
	EventTampered = "Tampered"
	// EventShortTTL: spec.ttlSeconds is shorter than a failover of the operator's leader.
	EventShortTTL = "TTLShorterThanFailover"
	// EventLockNotFound: a gated Job names a DistributedLock that does not exist.
	EventLockNotFound = "LockNotFound"
	// EventWaiting: a gated Job waits in the lock's queue.
	EventWaiting = "Waiting"
	// EventSkipped: a gated Job with contention Skip did not run (on the Job and its CronJob).
	EventSkipped = "Skipped"
	// EventUnsuspendedWithoutLock: a gated Job was unsuspended by someone else
	// before it held the lock, and was suspended again.
	EventUnsuspendedWithoutLock = "UnsuspendedWithoutLock"
	// EventNoKey: a gated Job or Pod of a lock with spec.keyFrom has no
	// derived key (it was admitted before the lock derived keys) and cannot
	// take the lock.
	EventNoKey = "NoKey"
	// EventWaitTimedOut: a gated Job waited longer than its maximum wait and ended.
	EventWaitTimedOut = "WaitTimedOut"
	// EventSuperseded: a waiting Job ended because a newer Job of its CronJob
	// joined the queue (contention QueueLatest).
	EventSuperseded = "Superseded"
	// EventReplaced: a waiting Job ended because a newer workload joined the
	// queue of its key (contention ReplaceQueued or CancelInProgress).
	EventReplaced = "Replaced"
	// EventCancelling: a waiting Job with contention CancelInProgress asked
	// the running Job of its key to stop.
	EventCancelling = "Cancelling"
	// EventCancelled: a running Job was stopped because a newer Job of its
	// lock with contention CancelInProgress asked for its key.
	EventCancelled = "Cancelled"
	// EventHoldEnded: a manual holder's until or maxHoldSeconds passed and
	// its lease was released.
	EventHoldEnded = "HoldEnded"
	// EventHoldWindowOpened: a window of spec.holds opened; its hold
	// acquires the keys.
	EventHoldWindowOpened = "HoldWindowOpened"
	// EventHoldWindowClosed: a window of spec.holds closed; its hold
	// released the keys.
	EventHoldWindowClosed = "HoldWindowClosed"
	// EventCooldown: a holder released the lock and the keys stay held for
	// spec.cooldownSeconds.
	EventCooldown = "Cooldown"
	// EventForceReleased: a holder's lease was taken away on request
	// (AnnotationForceRelease): on the lock and on the holding Job.
	EventForceReleased = "ForceReleased"
	// EventForceReleaseRefused: a force-release request could not be carried
	// out (no holder of this lock has that token, or no admission record of
	// who asked).
	EventForceReleaseRefused = "ForceReleaseRefused"
	// EventReleaseWaitsForPods: a Job that held the lock was deleted or
	// finished while some of its pods may still run; the lock stays held
	// until they stop.
	EventReleaseWaitsForPods = "ReleaseWaitsForPods"
	// EventTerminated: a Job's pods were stopped because its lease was lost and
	// the lock's onLost is Terminate.
	EventTerminated = "Terminated"
)
