package backend

import (
	"testing"
	"time"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

func TestBoost(t *testing.T) {
	withPriority := func(s, highest int32) *locksv1alpha1.DistributedLock {
		dl := &locksv1alpha1.DistributedLock{}
		dl.Spec.Priority = &locksv1alpha1.Priority{MaxStarvationSeconds: s, Highest: highest}
		return dl
	}
	for _, tc := range []struct {
		name string
		dl   *locksv1alpha1.DistributedLock
		p    int32
		want time.Duration
	}{
		{"no priority on the lock", &locksv1alpha1.DistributedLock{}, 1000, 0},
		{"zero", withPriority(600, 1000), 0, 0},
		{"negative", withPriority(600, 1000), -5, 0},
		{"half", withPriority(600, 1000), 500, 300 * time.Second},
		{"highest", withPriority(600, 1000), 1000, 600 * time.Second},
		{"above highest", withPriority(600, 1000), 2_000_000_000, 600 * time.Second},
		{"default highest", withPriority(600, 0), 100, 60 * time.Second},
		{"largest values", withPriority(86400, 1_000_000_000), 999_999_999, 86399999 * time.Millisecond},
		{"small share", withPriority(1, 1_000_000_000), 1, 0},
	} {
		if got := Boost(tc.dl, tc.p); got != tc.want {
			t.Errorf("%s: Boost(%d) = %v, want %v", tc.name, tc.p, got, tc.want)
		}
	}
}

func TestWorkloadPriority(t *testing.T) {
	seven := int32(7)
	for _, tc := range []struct {
		ann      map[string]string
		fallback *int32
		want     int32
	}{
		{nil, nil, 0},
		{nil, &seven, 7},
		{map[string]string{locksv1alpha1.AnnotationPriority: "100"}, &seven, 100},
		{map[string]string{locksv1alpha1.AnnotationPriority: "-3"}, nil, -3},
		// Not a number (the webhook refuses it; an old object may have one).
		{map[string]string{locksv1alpha1.AnnotationPriority: "high"}, &seven, 7},
		{map[string]string{locksv1alpha1.AnnotationPriority: "99999999999"}, nil, 0},
	} {
		if got := WorkloadPriority(tc.ann, tc.fallback); got != tc.want {
			t.Errorf("WorkloadPriority(%v, %v) = %d, want %d", tc.ann, tc.fallback, got, tc.want)
		}
	}
	if _, err := ParsePriority("high"); err == nil {
		t.Error(`ParsePriority("high") took it`)
	}
}

func TestWorkloadWeight(t *testing.T) {
	for v, want := range map[string]int{"": 1, "1": 1, "3": 3, "100": 100, "0": 1, "-2": 1, "101": 1, "heavy": 1} {
		ann := map[string]string{}
		if v != "" {
			ann[locksv1alpha1.AnnotationWeight] = v
		}
		if got := WorkloadWeight(ann); got != want {
			t.Errorf("WorkloadWeight(%q) = %d, want %d", v, got, want)
		}
	}
	for _, bad := range []string{"0", "101", "2.5", "three"} {
		if _, err := ParseWeight(bad); err == nil {
			t.Errorf("ParseWeight(%q) took it", bad)
		}
	}
}
