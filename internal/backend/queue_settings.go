package backend

import (
	"fmt"
	"strconv"
	"time"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// Boost is the head start in dl's queue (lock.Request.Boost) of a workload
// of priority p: maxStarvationSeconds × min(p, highest) / highest, none for
// p ≤ 0 or a lock without spec.priority (see locksv1alpha1.Priority).
func Boost(dl *locksv1alpha1.DistributedLock, p int32) time.Duration {
	if dl == nil || dl.Spec.Priority == nil || p <= 0 || dl.Spec.Priority.MaxStarvationSeconds <= 0 {
		return 0
	}
	highest := int64(dl.Spec.Priority.Highest)
	if highest <= 0 {
		highest = locksv1alpha1.DefaultPriorityHighest
	}
	share := min(int64(p), highest)
	// In milliseconds: 86,400,000 × 1,000,000,000 fits in an int64.
	ms := int64(dl.Spec.Priority.MaxStarvationSeconds) * 1000 * share / highest
	return time.Duration(ms) * time.Millisecond
}

// ParsePriority reads a lockwarden.io/priority annotation value: an
// integer in the int32 range.
func ParsePriority(v string) (int32, error) {
	p, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is not a priority: want an integer from -2147483648 to 2147483647, higher first (for example 100)", v)
	}
	return int32(p), nil
}

// WorkloadPriority is a workload's priority: its lockwarden.io/priority
// annotation when it has a valid one, else fallback (a Pod's or Kueue
// Workload's spec.priority; nil for none), else 0.
func WorkloadPriority(annotations map[string]string, fallback *int32) int32 {
	if v, ok := annotations[locksv1alpha1.AnnotationPriority]; ok {
		if p, err := ParsePriority(v); err == nil {
			return p
		}
	}
	if fallback != nil {
		return *fallback
	}
	return 0
}

// ParseWeight reads a lockwarden.io/weight annotation value: an integer
// from 1 to lock.MaxLimit (the lock's maxHolders bounds it further).
func ParseWeight(v string) (int, error) {
	w, err := strconv.Atoi(v)
	if err != nil || w < 1 || w > 100 {
		return 0, fmt.Errorf("%q is not a weight: want an integer from 1 to the lock's maxHolders (at most 100), the slots the workload takes", v)
	}
	return w, nil
}

// WorkloadWeight is the slots a workload takes: its lockwarden.io/weight
// annotation when it has a valid one, else 1.
func WorkloadWeight(annotations map[string]string) int {
	if w, err := ParseWeight(annotations[locksv1alpha1.AnnotationWeight]); err == nil {
		return w
	}
	return 1
}
