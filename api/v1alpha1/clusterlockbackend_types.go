package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClusterLockBackendSpec says where locks that name this backend live and
// which namespaces may use it.
type ClusterLockBackendSpec struct {
	// The store: exactly one of redis, postgres, zookeeper, etcd or kubernetes.
	Store `json:",inline"`

	// namespaceSelector selects the namespaces whose DistributedLocks (and
	// gated Jobs) may use this backend. {} selects every namespace. Locks in
	// other namespaces are refused with reason BackendNotAllowed.
	// +required
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector"`

	// globalScopeNamespaceSelector selects the namespaces (among those
	// namespaceSelector selects) whose locks may use scope Global on this
	// backend, sharing keys across namespaces. Default: none.
	// +optional
	GlobalScopeNamespaceSelector *metav1.LabelSelector `json:"globalScopeNamespaceSelector,omitempty"`

	// globalKeyPrefixes lists the prefixes that every key of a Global lock on
	// this backend must start with (for example billing/); a lock with
	// another key is refused with reason ScopeNotAllowed. Empty (default):
	// any key. Up to 16 unique prefixes of 1 to 200 characters (a lock
	// key's length). Several ClusterLockBackends may point at the
	// same store, each selecting other namespaces for Global and allowing
	// other prefixes: that gives each team its own Global keys. Locks with
	// scope Namespace are not affected.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=200
	GlobalKeyPrefixes []string `json:"globalKeyPrefixes,omitempty"`
}

// BackendStatus is how a ClusterLockBackend or LockBackend is used and
// whether it answers.
type BackendStatus struct {
	// type is the kind of store the backend names: Redis, PostgreSQL,
	// ZooKeeper or etcd.
	// +optional
	Type string `json:"type,omitempty"`

	// endpoints lists where the operator connects, for display.
	// +optional
	Endpoints string `json:"endpoints,omitempty"`

	// locks is how many DistributedLocks name this backend.
	// +optional
	Locks int32 `json:"locks"`

	// conditions: Ready (the backend answers, as the operator's health check
	// of the client its locks share last found; reasons Reachable,
	// Unreachable, NotInUse) and, for Redis, StoreConfigured (False, reason
	// UnsafeSetting, while a server has a setting that makes leases unsafe,
	// such as a maxmemory-policy other than noeviction).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=clb,categories=lockwarden
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.status.type`
// +kubebuilder:printcolumn:name="Endpoints",type=string,JSONPath=`.status.endpoints`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Locks",type=integer,JSONPath=`.status.locks`
// +kubebuilder:printcolumn:name="Sentinel",type=string,JSONPath=`.spec.redis.sentinel.masterName`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// ClusterLockBackend is a lock backend that the cluster's administrators own:
// where the operator connects, with which TLS settings and credentials, and
// which namespaces may use it. DistributedLocks name it in
// spec.backend.clusterBackendRef (the cert-manager ClusterIssuer pattern).
type ClusterLockBackend struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec declares the backend and who may use it.
	// +required
	Spec ClusterLockBackendSpec `json:"spec"`

	// status is how the backend is used and whether it answers.
	// +optional
	Status BackendStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ClusterLockBackendList contains a list of ClusterLockBackend.
type ClusterLockBackendList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the backends.
	Items []ClusterLockBackend `json:"items"`
}
