package devcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/testutil/pgtest"
	"github.com/lockwarden/lockwarden/internal/testutil/zktest"
)

// The lock stores a cluster can point its ClusterLockBackend DevBackend at
// (Options.Store).
const (
	StoreRedis     = "redis"
	StorePostgres  = "postgres"
	StoreZooKeeper = "zookeeper"
	StoreEtcd      = "etcd"
	// StoreKubernetes keeps the locks as Lease objects in the cluster's own
	// API server: nothing to start.
	StoreKubernetes = "kubernetes"

	// DevBackend is the ClusterLockBackend the cluster creates for the
	// store Options.Store chose (for redis, the first master, as
	// DevRedisBackend), selecting every namespace. config/samples' locks name it.
	DevBackend = "dev"
)

// StoreKinds lists the valid values of Options.Store, the default first.
var StoreKinds = []string{StoreRedis, StorePostgres, StoreZooKeeper, StoreEtcd, StoreKubernetes}

// ValidateStore returns nil when kind is one of StoreKinds (or empty: the
// default, redis), else an error that lists them.
func ValidateStore(kind string) error {
	if kind == "" || slices.Contains(StoreKinds, kind) {
		return nil
	}
	return fmt.Errorf("unknown store %q: want one of %s", kind, strings.Join(StoreKinds, ", "))
}

// Store is a lock store on loopback that ClusterLockBackends can point at:
// the cluster's first Redis master, or a PostgreSQL, ZooKeeper or etcd
// server the cluster started beside it (StartStore).
type Store struct {
	// Kind is one of StoreKinds.
	Kind string
	// Addrs are the servers' host:port client addresses (one here).
	Addrs []string
	// LogPaths are the servers' log files. PostgreSQL's lives in the
	// server's own directory (the postgres user must own it when running as
	// root) and is copied into the cluster's log directory when it stops.
	LogPaths []string
	// Database, User and Password are what PostgreSQL clients log in with
	// (pgtest's database and role: CONNECT and CREATE on the database).
	Database, User, Password string

	stopOnce sync.Once
	stop     func()
}

// Stop stops the store's servers (not Redis, which the cluster owns). The
// cluster's Stop stops every store it started.
func (s *Store) Stop() {
	s.stopOnce.Do(func() {
		if s.stop != nil {
			s.stop()
		}
	})
}

// String describes the store for logs: kind and addresses.
func (s *Store) String() string {
	if len(s.Addrs) == 0 {
		return s.Kind + " (the cluster's API server)"
	}
	return s.Kind + " at " + strings.Join(s.Addrs, ",")
}

// StartStore starts a store of kind on loopback and returns once it serves
// clients; the cluster stops it on Stop (or call Store.Stop earlier). For
// StoreRedis it starts nothing and returns the first Redis master. `make dev
// BACKEND=...` starts its store with it, as the end-to-end suite does.
func (c *Cluster) StartStore(ctx context.Context, kind string) (*Store, error) {
	if kind == "" {
		kind = StoreRedis
	}
	if err := ValidateStore(kind); err != nil {
		return nil, err
	}
	begin := time.Now()
	var (
		s   *Store
		err error
	)
	switch kind {
	case StoreRedis:
		if len(c.Redis) == 0 || c.Redis[0].Addr == "" {
			return nil, fmt.Errorf("no Redis master is running")
		}
		return &Store{Kind: StoreRedis, Addrs: []string{c.Redis[0].Addr}, LogPaths: []string{c.Redis[0].LogPath}}, nil
	case StorePostgres:
		s, err = c.startPostgres()
	case StoreZooKeeper:
		s, err = c.startZooKeeper()
	case StoreEtcd:
		s, err = c.startStoreEtcd(ctx)
	case StoreKubernetes:
		return &Store{Kind: StoreKubernetes}, nil
	}
	if s != nil {
		c.storesMu.Lock()
		c.stores = append(c.stores, s)
		c.storesMu.Unlock()
	}
	if err != nil {
		if s != nil {
			s.Stop()
		}
		return nil, fmt.Errorf("start %s: %w", kind, err)
	}
	c.opts.logf("%s ready at %s, log %s (%s)", kind, strings.Join(s.Addrs, ","), strings.Join(s.LogPaths, ", "), since(begin))
	return s, nil
}

// storeSeq numbers the stores a cluster starts, for their directories and log names.
func (c *Cluster) storeSeq() int {
	c.storesMu.Lock()
	defer c.storesMu.Unlock()
	c.storeCount++
	return c.storeCount
}

// startPostgres starts one PostgreSQL server with pgtest (its binaries from
// /usr/lib/postgresql/*/bin; as the postgres user when running as root)
// with a random password for its role.
func (c *Cluster) startPostgres() (*Store, error) {
	pw, err := randomPassword()
	if err != nil {
		return nil, err
	}
	srv, err := pgtest.Launch(pgtest.WithPassword(pw))
	if srv == nil {
		return nil, err
	}
	n := c.storeSeq()
	s := &Store{
		Kind:     StorePostgres,
		Addrs:    []string{srv.Addr},
		LogPaths: []string{srv.LogPath()},
		Database: srv.Database,
		User:     srv.User,
		Password: srv.Password,
	}
	s.stop = func() {
		_ = copyFile(srv.LogPath(), c.LogPath(fmt.Sprintf("postgres-%d", n)))
		srv.Close()
	}
	return s, err
}

// startZooKeeper starts one standalone ZooKeeper server with zktest (java
// and /usr/share/java/zookeeper.jar), its data and log under the cluster's
// directory.
func (c *Cluster) startZooKeeper() (*Store, error) {
	dir := filepath.Join(c.Dir, fmt.Sprintf("zookeeper-%d", c.storeSeq()))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	e, err := zktest.Launch(dir, 1)
	if e == nil {
		return nil, err
	}
	s := &Store{Kind: StoreZooKeeper, Addrs: e.Addrs(), stop: e.Close}
	for _, srv := range e.Servers {
		s.LogPaths = append(s.LogPaths, newest(filepath.Join(dir, fmt.Sprintf("zk%d-*", srv.ID), "server.log")))
	}
	return s, err
}

// newest returns the most recently modified file that matches pattern, or
// pattern itself when none does.
func newest(pattern string) string {
	matches, _ := filepath.Glob(pattern)
	best, bestTime := pattern, time.Time{}
	for _, m := range matches {
		if fi, err := os.Stat(m); err == nil && fi.ModTime().After(bestTime) {
			best, bestTime = m, fi.ModTime()
		}
	}
	return best
}

// startStoreEtcd starts a one-member etcd, apart from the control plane's,
// from the etcd binary in Assets.
func (c *Cluster) startStoreEtcd(ctx context.Context) (*Store, error) {
	name := fmt.Sprintf("etcd-store-%d", c.storeSeq())
	dir := filepath.Join(c.Dir, name)
	s := &Store{Kind: StoreEtcd, LogPaths: []string{c.LogPath(name)}}
	var proc *process
	s.stop = func() {
		if proc != nil {
			proc.stop()
		}
	}
	err := c.onFreePorts(name, nil, 2, func(p []int) error {
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		clientURL := fmt.Sprintf("http://127.0.0.1:%d", p[0])
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", p[1])
		proc = c.newProcess(name, c.asset("etcd"), []string{
			"--name=store",
			"--data-dir=" + dir,
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=store=" + peerURL,
			"--unsafe-no-fsync=true",
			"--log-level=warn",
		}, []int{p[0], p[1]})
		s.Addrs = []string{"127.0.0.1:" + strconv.Itoa(p[0])}
		if err := proc.start(); err != nil {
			return err
		}
		return c.waitHTTP(ctx, proc, clientURL+"/health", "", func(body string) bool { return strings.Contains(body, `"health":"true"`) })
	})
	return s, err
}

// stopStores stops every store StartStore started, in parallel.
func (c *Cluster) stopStores() {
	c.storesMu.Lock()
	stores := c.stores
	c.stores = nil
	c.storesMu.Unlock()
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Go(s.Stop)
	}
	wg.Wait()
}

// PasswordSecretName is the Secret in OperatorNamespace that ApplyBackend
// creates for the ClusterLockBackend name when its store needs a password
// (PostgreSQL), under the key "password".
func PasswordSecretName(name string) string { return name + "-password" }

// ApplyBackend creates, or updates, the ClusterLockBackend name pointing at
// store s, usable from every namespace, with the Secret its password needs
// (PasswordSecretName, in OperatorNamespace). It records itself as kubectl's
// last applied configuration, so that `kubectl apply` of a manifest with the
// same name updates it quietly.
func (c *Cluster) ApplyBackend(ctx context.Context, name string, s *Store) error {
	want, secret, err := StoreClusterLockBackend(name, s)
	if err != nil {
		return err
	}
	if secret != nil {
		if err := c.applySecret(ctx, secret); err != nil {
			return err
		}
	}
	if err := c.applyClusterLockBackend(ctx, want); err != nil {
		return err
	}
	c.opts.logf("ClusterLockBackend %s: %s, every namespace", name, s)
	return nil
}

// StoreClusterLockBackend returns the ClusterLockBackend name for store s,
// selecting every namespace, and the Secret it reads its password from (nil
// when it needs none).
func StoreClusterLockBackend(name string, s *Store) (*locksv1alpha1.ClusterLockBackend, *corev1.Secret, error) {
	if len(s.Addrs) == 0 && s.Kind != StoreKubernetes {
		return nil, nil, fmt.Errorf("store %s has no address", s.Kind)
	}
	b := &locksv1alpha1.ClusterLockBackend{
		TypeMeta:   metav1.TypeMeta{APIVersion: locksv1alpha1.GroupVersion.String(), Kind: "ClusterLockBackend"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       locksv1alpha1.ClusterLockBackendSpec{NamespaceSelector: &metav1.LabelSelector{}},
	}
	var secret *corev1.Secret
	switch s.Kind {
	case StoreRedis:
		b.Spec.Redis = &locksv1alpha1.RedisBackend{Endpoints: s.Addrs}
	case StorePostgres:
		host, portStr, ok := strings.Cut(s.Addrs[0], ":")
		port, err := strconv.ParseInt(portStr, 10, 32)
		if !ok || err != nil {
			return nil, nil, fmt.Errorf("postgres address %q is not host:port", s.Addrs[0])
		}
		b.Spec.Postgres = &locksv1alpha1.PostgresBackend{Host: host, Port: int32(port), Database: s.Database, User: s.User}
		if s.Password != "" {
			ref := locksv1alpha1.SecretKeyRef{Name: PasswordSecretName(name), Key: "password"}
			b.Spec.Postgres.PasswordSecretRef = &ref
			secret = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: OperatorNamespace, Name: ref.Name},
				Data:       map[string][]byte{ref.Key: []byte(s.Password)},
			}
		}
	case StoreZooKeeper:
		b.Spec.ZooKeeper = &locksv1alpha1.ZooKeeperBackend{Servers: s.Addrs}
	case StoreEtcd:
		b.Spec.Etcd = &locksv1alpha1.EtcdBackend{Endpoints: s.Addrs}
	case StoreKubernetes:
		b.Spec.Kubernetes = &locksv1alpha1.KubernetesBackend{}
	default:
		return nil, nil, ValidateStore(s.Kind)
	}
	return b, secret, nil
}

// applyClusterLockBackend creates or updates want, recording it as kubectl's
// last applied configuration, as `kubectl create --save-config` does.
func (c *Cluster) applyClusterLockBackend(ctx context.Context, want *locksv1alpha1.ClusterLockBackend) error {
	last, err := json.Marshal(want)
	if err != nil {
		return err
	}
	want.Annotations = map[string]string{corev1.LastAppliedConfigAnnotation: string(last)}
	var cur locksv1alpha1.ClusterLockBackend
	err = c.Client.Get(ctx, types.NamespacedName{Name: want.Name}, &cur)
	switch {
	case apierrors.IsNotFound(err):
		err = c.Client.Create(ctx, want)
	case err == nil:
		cur.Spec = want.Spec
		cur.Annotations = want.Annotations
		err = c.Client.Update(ctx, &cur)
	}
	if err != nil {
		return fmt.Errorf("apply ClusterLockBackend %s: %w", want.Name, err)
	}
	return nil
}

func (c *Cluster) applySecret(ctx context.Context, want *corev1.Secret) error {
	var cur corev1.Secret
	err := c.Client.Get(ctx, client.ObjectKeyFromObject(want), &cur)
	switch {
	case apierrors.IsNotFound(err):
		err = c.Client.Create(ctx, want)
	case err == nil:
		cur.Data = want.Data
		err = c.Client.Update(ctx, &cur)
	}
	if err != nil {
		return fmt.Errorf("apply Secret %s: %w", client.ObjectKeyFromObject(want), err)
	}
	return nil
}

func randomPassword() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
