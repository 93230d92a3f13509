// Package holder names the holders of lockwarden's leases and derives their
// owner tokens.
//
// A holder is recorded in Redis as a self-describing string, so that every
// operator that shares the keys (in this cluster or another) can show who
// holds them. The owner token of a holder is an HMAC of the holder's identity
// under a key only the operator knows: a new leader (or a restarted manager)
// derives the same token again and keeps renewing the lease, while nobody who
// can merely read the cluster's objects can forge it.
package holder

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/lockwarden/lockwarden/internal/printable"
)

// prefix marks a holder string written by lockwarden (format version 1).
const prefix = "lockwarden/v1|"

// Ref names the Kubernetes object a lease is held for: a DistributedLock
// (its manual holder) or a gated Job. It is the one key under which the
// operator keeps everything about a holder: the renewed lease, the backend
// client it uses, the reconcile requests about it.
type Ref struct {
	// Kind of the holding object: "DistributedLock" or "Job".
	Kind      string
	Namespace string
	Name      string
}

// String returns Kind/namespace/name.
func (r Ref) String() string { return r.Kind + "/" + r.Namespace + "/" + r.Name }

// Holder identifies one holder of a lease.
type Holder struct {
	// Cluster is the name of the cluster the holder runs in (the operator's --cluster-name).
	Cluster string
	// Kind of the holding object: "DistributedLock" for a manual holder, "Job" for a gated Job.
	Kind string
	// Namespace and Name of the holding object.
	Namespace string
	Name      string
	// UID of the holding object; it makes the owner token unique per object.
	UID string
	// Lock is the name of the DistributedLock (in Namespace) the holder acquired through.
	Lock string
	// Identity is the name shown to users: a manual holder's spec.holder.identity,
	// or cluster/namespace/Kind/name/uid-prefix for a workload.
	Identity string
}

// Encode returns the string stored in Redis beside the lease.
func (h Holder) Encode() string {
	return prefix + strings.Join([]string{h.Cluster, h.Namespace, h.Lock, h.Kind, h.Name, h.UID, h.Identity}, "|")
}

// Decode parses a holder string. A string lockwarden did not write (another
// program using the same keys) is returned as a Holder with only Identity set.
func Decode(s string) Holder {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok {
		return Holder{Identity: s}
	}
	parts := strings.SplitN(rest, "|", 7)
	if len(parts) != 7 {
		return Holder{Identity: s}
	}
	return Holder{Cluster: parts[0], Namespace: parts[1], Lock: parts[2], Kind: parts[3], Name: parts[4], UID: parts[5], Identity: parts[6]}
}

// Lengths at most of the fields of a holder as status shows them: the
// maxLength of status.holder, status.holders[] and status.waiting[] in the
// CRD (api/v1alpha1, HolderStatus and WaiterStatus). MaxShownIdentity fits
// a manual holder's identity (128) and a workload's,
// cluster/namespace/Kind/name/uid-prefix (over 128 with long names).
const (
	MaxShownIdentity = 512
	MaxShownName     = 253 // cluster, lock and name
	MaxShownLabel    = 63  // namespace and kind
)

// Shown returns h as it may be shown to users (in status, conditions and
// Events): every field with its unprintable characters escaped and cut to
// its length at most. Whoever can write the backend chooses what Decode
// returns; Shown keeps that from forging lines or reaching a terminal as
// control sequences. Compare and derive tokens from h, never from Shown.
func (h Holder) Shown() Holder {
	return Holder{
		Cluster:   printable.Bounded(h.Cluster, MaxShownName),
		Kind:      printable.Bounded(h.Kind, MaxShownLabel),
		Namespace: printable.Bounded(h.Namespace, MaxShownLabel),
		Name:      printable.Bounded(h.Name, MaxShownName),
		UID:       printable.Bounded(h.UID, MaxShownName),
		Lock:      printable.Bounded(h.Lock, MaxShownName),
		Identity:  printable.Bounded(h.Identity, MaxShownIdentity),
	}
}

// Of reports whether h acquired through the DistributedLock namespace/lock of cluster.
func (h Holder) Of(cluster, namespace, lock string) bool {
	return h.Cluster == cluster && h.Namespace == namespace && h.Lock == lock
}

// Ref returns the object h holds for.
func (h Holder) Ref() Ref { return Ref{Kind: h.Kind, Namespace: h.Namespace, Name: h.Name} }

// WorkloadIdentity is the identity shown for a workload holder:
// cluster/namespace/Kind/name/first five characters of the UID.
func WorkloadIdentity(cluster, namespace, kind, name, uid string) string {
	short := uid
	if len(short) > 5 {
		short = short[:5]
	}
	return fmt.Sprintf("%s/%s/%s/%s/%s", cluster, namespace, kind, name, short)
}

// Tokens derives owner tokens from a secret key.
type Tokens struct {
	key     []byte
	sealKey []byte
}

// MinKeyLen is the shortest key NewTokens accepts, in bytes.
const MinKeyLen = 32

// NewTokens returns a token source for key, which must hold at least MinKeyLen bytes.
func NewTokens(key []byte) (*Tokens, error) {
	if len(key) < MinKeyLen {
		return nil, fmt.Errorf("owner key has %d bytes, at least %d are required", len(key), MinKeyLen)
	}
	seal := hmac.New(sha256.New, key)
	seal.Write([]byte(sealKeyLabel))
	return &Tokens{key: append([]byte(nil), key...), sealKey: seal.Sum(nil)}, nil
}

// sealKeyLabel derives the key of request seals from the owner key, so that
// no seal is ever an owner token and no owner token a seal.
const sealKeyLabel = "lockwarden.io/force-release-seal/v1"

// ForceReleaseSeal returns the seal of a force-release request: an HMAC,
// under a key derived from the owner key, of the lock (namespace and name),
// the fencing token asked for and the user who asked. The admission webhook
// stamps it beside the user's name; the operator carries out only a request
// whose seal matches (VerifyForceReleaseSeal). A record written anywhere
// else (a namespace the webhook skips, a cluster where it does not run)
// cannot name anyone, because nobody without the owner key can seal one.
// A seal can be copied only onto the same request: the same user asking
// for the same lease of the same lock again.
func (t *Tokens) ForceReleaseSeal(namespace, lock, token, user string) string {
	m := hmac.New(sha256.New, t.sealKey)
	for _, f := range []string{namespace, lock, token, user} {
		// Length-prefixed, so that no two field lists read the same.
		m.Write(binary.BigEndian.AppendUint64(nil, uint64(len(f))))
		m.Write([]byte(f))
	}
	return hex.EncodeToString(m.Sum(nil))
}

// VerifyForceReleaseSeal reports whether seal is ForceReleaseSeal of the
// same request, in constant time.
func (t *Tokens) VerifyForceReleaseSeal(namespace, lock, token, user, seal string) bool {
	want := t.ForceReleaseSeal(namespace, lock, token, user)
	return hmac.Equal([]byte(want), []byte(seal))
}

// Owner returns the 128-bit owner token of h, hex encoded: the same for the
// same holder on every replica of the operator, and different for every
// object UID and identity.
func (t *Tokens) Owner(h Holder) string {
	m := hmac.New(sha256.New, t.key)
	m.Write([]byte(h.Encode()))
	return hex.EncodeToString(m.Sum(nil)[:16])
}
