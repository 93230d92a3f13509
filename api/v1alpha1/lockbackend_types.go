package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LockBackendSpec says where the locks that name this backend live.
type LockBackendSpec struct {
	// The store: exactly one of redis, postgres, zookeeper, etcd or kubernetes.
	Store `json:",inline"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lb,categories=lockwarden
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.status.type`
// +kubebuilder:printcolumn:name="Endpoints",type=string,JSONPath=`.status.endpoints`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Locks",type=integer,JSONPath=`.status.locks`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// LockBackend is a lock backend a namespace owns: the endpoints, TLS and
// credentials its DistributedLocks share by naming it in
// spec.backend.backendRef (the cert-manager Issuer pattern; see
// ClusterLockBackend for backends the cluster's administrators own). It is
// as trusted as inline endpoints: the operator's endpoint policy applies.
type LockBackend struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec declares the backend.
	// +required
	Spec LockBackendSpec `json:"spec"`

	// status is how the backend is used and whether it answers.
	// +optional
	Status BackendStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// LockBackendList contains a list of LockBackend.
type LockBackendList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the backends.
	Items []LockBackend `json:"items"`
}
