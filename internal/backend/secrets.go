package backend

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// SecretError says a Secret or key that a lock references is missing or
// unreadable, or holds a value over its size limit.
type SecretError struct {
	Field string
	Err   error
}

func (e *SecretError) Error() string { return fmt.Sprintf("%s: %v", e.Field, e.Err) }

// Unwrap returns the cause.
func (e *SecretError) Unwrap() error { return e.Err }

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
