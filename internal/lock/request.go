package lock

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"
)

// NewOwnerToken returns 128 random bits, hex encoded.
func NewOwnerToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate owner token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// ValidateRequest checks a Request before anything is sent to a backend.
func ValidateRequest(req Request) error {
	if len(req.Keys) == 0 {
		return &InvalidRequestError{Field: "keys", Reason: fmt.Sprintf("at least one key is required (at most %d)", MaxKeys)}
	}
	if len(req.Keys) > MaxKeys {
		return &InvalidRequestError{Field: "keys", Reason: fmt.Sprintf("%d keys given, at most %d allowed", len(req.Keys), MaxKeys)}
	}
	if err := ValidateKeys(req.Keys); err != nil {
		return err
	}
	if req.TTL < MinTTL {
		return &InvalidRequestError{Field: "ttl", Reason: fmt.Sprintf("%v is below the minimum of %v", req.TTL, MinTTL)}
	}
	if req.Limit < 0 || req.Limit > MaxLimit {
		return &InvalidRequestError{Field: "limit", Reason: fmt.Sprintf("%d is outside 0 to %d (0 or 1: one holder; N: N holders at once)", req.Limit, MaxLimit)}
	}
	if req.Replace && !req.Queue {
		return &InvalidRequestError{Field: "replace", Reason: "needs queue: only a request that waits in the queue replaces the older waiters"}
	}
	switch {
	case req.Boost < 0 || req.Boost > MaxBoost:
		return &InvalidRequestError{Field: "boost", Reason: fmt.Sprintf("%v is outside 0 to %v (the head start a waiter gets in the queue)", req.Boost, MaxBoost)}
	case req.Boost > 0 && !req.Queue:
		return &InvalidRequestError{Field: "boost", Reason: "needs queue: only a request that waits in the queue gets a head start in it"}
	}
	switch {
	case req.Weight < 0 || req.Weight > MaxLimit:
		return &InvalidRequestError{Field: "weight", Reason: fmt.Sprintf("%d is outside 0 to %d (the slots of a semaphore the request takes)", req.Weight, MaxLimit)}
	case req.Weight > req.Holders():
		return &InvalidRequestError{Field: "weight", Reason: fmt.Sprintf("%d slots asked of a lock with limit %d: a request takes 1 to limit slots", req.Weight, req.Holders())}
	}
	if req.Preempt {
		switch {
		case !req.Replace || !req.Queue:
			return &InvalidRequestError{Field: "preempt", Reason: "needs queue and replace: a request that stops the holders also replaces the older waiters, and waits for the keys"}
		case req.Limit > 1:
			return &InvalidRequestError{Field: "preempt", Reason: fmt.Sprintf("only for an exclusive request (limit 0 or 1), got limit %d: the holders of a semaphore's slots are not stopped by a newcomer", req.Limit)}
		}
	}
	return nil
}

// ValidateKeys checks that keys are non-empty, unique and free of whitespace.
func ValidateKeys(keys []string) error {
	// Few keys (the common case is one) are compared pairwise: no map on
	// every acquisition.
	var seen map[string]struct{}
	if len(keys) > 8 {
		seen = make(map[string]struct{}, len(keys))
	}
	for i, k := range keys {
		if k == "" {
			return &InvalidRequestError{Field: fmt.Sprintf("keys[%d]", i), Reason: "a key must not be empty"}
		}
		if strings.ContainsAny(k, " \t\r\n") {
			return &InvalidRequestError{Field: fmt.Sprintf("keys[%d]", i), Reason: fmt.Sprintf("key %q must not contain whitespace", k)}
		}
		dup := false
		if seen != nil {
			_, dup = seen[k]
			seen[k] = struct{}{}
		} else {
			dup = slices.Contains(keys[:i], k)
		}
		if dup {
			return &InvalidRequestError{Field: fmt.Sprintf("keys[%d]", i), Reason: fmt.Sprintf("duplicate key %q", k)}
		}
	}
	return nil
}

// PrepareRequest validates req for TryAcquire (try) or Acquire and fills in
// what the caller may leave out: a copy of the keys the caller can no longer
// change, and a new owner token when none is given. A queued TryAcquire
// needs the caller's owner token: it must call again with it to keep its
// place, and Dequeue with it to leave.
func PrepareRequest(req Request, try bool) (Request, error) {
	if err := ValidateRequest(req); err != nil {
		return req, err
	}
	if try && req.Queue && req.Owner == "" {
		return req, &InvalidRequestError{Field: "owner", Reason: "required with queue in TryAcquire: the waiter must call again with the same owner token to keep its place, and Dequeue with it to leave"}
	}
	req.Keys = slices.Clone(req.Keys)
	if req.Owner == "" {
		tok, err := NewOwnerToken()
		if err != nil {
			return req, err
		}
		req.Owner = tok
	}
	return req, nil
}

// ValidateKeyList checks a key list given outside a Request (to Inspect,
// Watch, Dequeue, or in a lease): 1 to MaxKeys keys as ValidateKeys wants
// them. field names the list in the error.
func ValidateKeyList(field string, keys []string) error {
	if len(keys) == 0 {
		return &InvalidRequestError{Field: field, Reason: fmt.Sprintf("at least one key is required (at most %d)", MaxKeys)}
	}
	if len(keys) > MaxKeys {
		return &InvalidRequestError{Field: field, Reason: fmt.Sprintf("%d keys given, at most %d allowed", len(keys), MaxKeys)}
	}
	return ValidateKeys(keys)
}

// ValidateLease checks a lease given to Renew or Release: present, with its
// owner token, its Limit in range and its keys valid.
func ValidateLease(lease *Lease) error {
	if lease == nil {
		return &InvalidRequestError{Field: "lease", Reason: "a lease is required, got nil"}
	}
	if lease.Owner == "" {
		return &InvalidRequestError{Field: "lease.owner", Reason: "the owner token is required: only the owner may renew or release a lease"}
	}
	if lease.Limit < 0 || lease.Limit > MaxLimit {
		return &InvalidRequestError{Field: "lease.limit", Reason: fmt.Sprintf("%d is outside 0 to %d (the Limit the lease was acquired with)", lease.Limit, MaxLimit)}
	}
	return ValidateKeyList("lease.keys", lease.Keys)
}

// ValidateTTL checks the TTL of a renewal.
func ValidateTTL(ttl time.Duration) error {
	if ttl < MinTTL {
		return &InvalidRequestError{Field: "ttl", Reason: fmt.Sprintf("%v is below the minimum of %v", ttl, MinTTL)}
	}
	return nil
}

// NewLease is the lease an acquisition of req returns: fence is its token,
// start when the attempt began and expires the end of its validity.
func NewLease(req Request, fence int64, start, expires time.Time) *Lease {
	return &Lease{
		Keys:     req.Keys,
		Owner:    req.Owner,
		Holder:   req.Holder,
		Fence:    fence,
		TTL:      req.TTL,
		Acquired: start,
		Expires:  expires,
		Limit:    req.Limit,
	}
}
