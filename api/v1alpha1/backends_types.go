package v1alpha1

// This file holds the backend members that sit beside redis in a
// ClusterLockBackend or LockBackend: PostgreSQL, ZooKeeper and etcd. A
// DistributedLock reaches them only through those objects (inline
// spec.backend is Redis only), so their credentials and endpoints are set up
// once per namespace or cluster.

// Store names the store that holds a backend's locks: exactly one member is
// set. Both LockBackend and ClusterLockBackend inline it in their spec. The
// Secrets a member names are read from the LockBackend's own namespace, or
// for a ClusterLockBackend from the operator's namespace (lockwarden-system
// by default), never from a lock's namespace. The endpoints of a
// LockBackend are checked against the operator's endpoint policy, as
// inline endpoints are.
// +kubebuilder:validation:XValidation:rule="[has(self.redis), has(self.postgres), has(self.zookeeper), has(self.etcd), has(self.kubernetes)].filter(x, x).size() == 1",message="spec: set exactly one store: redis, postgres, zookeeper, etcd or kubernetes"
// +kubebuilder:validation:XValidation:rule="!has(self.etcd) || has(self.etcd.username) == has(self.etcd.passwordSecretRef)",message="spec.etcd: set username and passwordSecretRef together"
type Store struct {
	// redis holds the locks in Redis: one server, a Sentinel-managed master,
	// or 3, 5 or 7 independent masters (Redlock). Its Secrets are read from
	// the LockBackend's own namespace, or for a ClusterLockBackend from the
	// operator's namespace, never from a lock's namespace.
	// +optional
	Redis *RedisBackend `json:"redis,omitempty"`

	// postgres holds the locks in a PostgreSQL database (a lease table the
	// operator creates and migrates). Its Secrets are read from
	// the LockBackend's own namespace, or for a ClusterLockBackend from the
	// operator's namespace, never from a lock's namespace.
	// +optional
	Postgres *PostgresBackend `json:"postgres,omitempty"`

	// zookeeper holds the locks in a ZooKeeper ensemble. Its Secrets are read from
	// the LockBackend's own namespace, or for a ClusterLockBackend from the
	// operator's namespace, never from a lock's namespace.
	// +optional
	ZooKeeper *ZooKeeperBackend `json:"zookeeper,omitempty"`

	// etcd holds the locks in an etcd cluster. Its Secrets are read from
	// the LockBackend's own namespace, or for a ClusterLockBackend from the
	// operator's namespace, never from a lock's namespace.
	// +optional
	Etcd *EtcdBackend `json:"etcd,omitempty"`

	// kubernetes holds the locks in the cluster's own API server, as Lease
	// objects in the operator's namespace: nothing to install or run, for
	// locks within one cluster. Each acquisition, release and queue change
	// is an API write; renewals cost one write per operator and TTL,
	// whatever the number of held locks.
	// +optional
	Kubernetes *KubernetesBackend `json:"kubernetes,omitempty"`
}

// KubernetesBackend holds locks as coordination.k8s.io Lease objects in the
// operator's namespace, which only the operator may write.
type KubernetesBackend struct {
	// prefix separates the locks of this backend from those of other
	// backends on the kubernetes store: backends with the same prefix share
	// their keys. Default lockwarden.
	// +optional
	// +kubebuilder:default=lockwarden
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Prefix string `json:"prefix,omitempty"`
}

// PostgresBackend holds locks in a PostgreSQL database: a lease table whose
// expiry follows the database's clock, fencing tokens from a per-key counter
// committed with the lease, the FIFO queue in a table, and LISTEN/NOTIFY for
// prompt handover. The operator creates and migrates its schema.
type PostgresBackend struct {
	// host is the server's DNS name or IP address (a Service name, say).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|[0-9A-Fa-f:.]+)$`
	Host string `json:"host"`

	// port is the server's TCP port. Default 5432.
	// +optional
	// +kubebuilder:default=5432
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`

	// database is the database to connect to.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Database string `json:"database"`

	// user is the role to connect as. It needs CONNECT on the database and
	// CREATE on it (to create the schema) or USAGE and CREATE on a schema an
	// administrator created; see docs/operations.md.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	User string `json:"user"`

	// passwordSecretRef names the key of a Secret that holds the role's
	// password: in the LockBackend's namespace, or the operator's namespace
	// for a ClusterLockBackend. Default: no password.
	// +optional
	PasswordSecretRef *SecretKeyRef `json:"passwordSecretRef,omitempty"`

	// schema is the schema the operator keeps its tables in. Default lockwarden.
	// +optional
	// +kubebuilder:default=lockwarden
	// +kubebuilder:validation:MaxLength=50
	// +kubebuilder:validation:Pattern=`^[a-z_][a-z0-9_]*$`
	Schema string `json:"schema,omitempty"`

	// tls, when set, requires TLS and verifies the server's certificate
	// (sslmode verify-full). Default: plain TCP.
	// +optional
	TLS *BackendTLS `json:"tls,omitempty"`
}

// ZooKeeperBackend holds locks in a ZooKeeper ensemble: ephemeral nodes
// that vanish with their holder's session, a FIFO queue in which each
// waiter watches only its predecessor, and fencing tokens from the
// ensemble's own transaction ids (zxid).
type ZooKeeperBackend struct {
	// servers are the ensemble's host:port client addresses, 1 to 7.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=7
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=261
	// +kubebuilder:validation:items:Pattern=`^([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$`
	Servers []string `json:"servers"`

	// root is the znode under which the operator keeps its nodes. Default /lockwarden.
	// +optional
	// +kubebuilder:default=/lockwarden
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^(/[A-Za-z0-9_.-]+)+$`
	Root string `json:"root,omitempty"`

	// sessionTimeoutSeconds is the ZooKeeper session timeout: how long the
	// ensemble keeps the leases of an operator it no longer hears from. The
	// server bounds it (by default 2 to 20 times its tickTime). Default 30.
	// +optional
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=300
	SessionTimeoutSeconds int32 `json:"sessionTimeoutSeconds,omitempty"`

	// maxClockSkewMilliseconds is how far apart the servers' wall clocks
	// may be. ZooKeeper stamps writes with its leader's clock, and the
	// operator takes over a holder whose operator is gone once the holder's
	// last write plus its TTL passed on the ensemble's clock: a leader whose
	// clock is ahead by more than this makes live leases look expired. A
	// holder is taken over only after its TTL plus this. Keep the servers on
	// NTP and this above their worst difference. Default 500.
	// +optional
	// +kubebuilder:default=500
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=600000
	MaxClockSkewMilliseconds int32 `json:"maxClockSkewMilliseconds,omitempty"`

	// digestSecretRef names the key of a Secret that holds "user:password"
	// for ZooKeeper digest authentication. When set, every node the operator
	// creates is readable and writable by that identity only. Default: no
	// authentication (nodes open to every client of the ensemble).
	// +optional
	DigestSecretRef *SecretKeyRef `json:"digestSecretRef,omitempty"`
}

// EtcdBackend holds locks in an etcd cluster: keys attached to etcd leases,
// waiters ordered by revision, and the revision of the acquiring
// transaction as fencing token.
type EtcdBackend struct {
	// endpoints are the cluster members' host:port client addresses, 1 to 7.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=7
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=261
	// +kubebuilder:validation:items:Pattern=`^([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$`
	Endpoints []string `json:"endpoints"`

	// prefix is the key prefix the operator keeps its keys under. Default /lockwarden/.
	// +optional
	// +kubebuilder:default=/lockwarden/
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^/[A-Za-z0-9_./-]*/$`
	Prefix string `json:"prefix,omitempty"`

	// username is the etcd user to authenticate as. Default: no authentication.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Username string `json:"username,omitempty"`

	// passwordSecretRef names the key of a Secret that holds the etcd user's
	// password. Required with username.
	// +optional
	PasswordSecretRef *SecretKeyRef `json:"passwordSecretRef,omitempty"`

	// tls, when set, connects over TLS. Default: plain TCP.
	// +optional
	TLS *BackendTLS `json:"tls,omitempty"`
}
