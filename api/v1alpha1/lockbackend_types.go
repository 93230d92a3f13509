package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LockBackendSpec says where the locks that name this backend live.
// +kubebuilder:validation:XValidation:rule="[has(self.redis), has(self.postgres), has(self.zookeeper), has(self.etcd)].filter(x, x).size() == 1",message="spec: set exactly one backend member: redis, postgres, zookeeper or etcd"
// +kubebuilder:validation:XValidation:rule="!has(self.etcd) || has(self.etcd.username) == has(self.etcd.passwordSecretRef)",message="spec.etcd: set username and passwordSecretRef together"
type LockBackendSpec struct {
	// redis holds the locks in Redis: one server, a Sentinel-managed master,
	// or 3, 5 or 7 independent masters (Redlock). The Secrets it names are
	// read from the LockBackend's own namespace. Its endpoints are checked
	// against the operator's endpoint policy, as inline endpoints are.
	// +optional
	Redis *RedisBackend `json:"redis,omitempty"`

	// postgres holds the locks in a PostgreSQL database (a lease table the
	// operator creates and migrates). Its host is checked against the
	// operator's endpoint policy; its password Secret is read from the
	// LockBackend's namespace.
	// +optional
	Postgres *PostgresBackend `json:"postgres,omitempty"`

	// zookeeper holds the locks in a ZooKeeper ensemble. Its servers are
	// checked against the operator's endpoint policy; its digest Secret is
	// read from the LockBackend's namespace.
	// +optional
	ZooKeeper *ZooKeeperBackend `json:"zookeeper,omitempty"`

	// etcd holds the locks in an etcd cluster. Its endpoints are checked
	// against the operator's endpoint policy; its Secrets are read from the
	// LockBackend's namespace.
	// +optional
	Etcd *EtcdBackend `json:"etcd,omitempty"`
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
