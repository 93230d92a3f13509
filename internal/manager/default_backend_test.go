package manager

import (
	"strings"
	"testing"
)

// TestDefaultBackendFlag: the default is "kubernetes", "" turns it off, and
// a name the API server would refuse is refused at start, naming the flag.
func TestDefaultBackendFlag(t *testing.T) {
	o, err := ParseFlags(nil)
	if err != nil || o.defaultBackend != DefaultClusterLockBackend {
		t.Fatalf("default: %q, %v; want %q", o.defaultBackend, err, DefaultClusterLockBackend)
	}
	if o, err = ParseFlags([]string{"--default-cluster-lock-backend="}); err != nil || o.defaultBackend != "" {
		t.Fatalf("empty: %q, %v; want none", o.defaultBackend, err)
	}
	_, err = ParseFlags([]string{"--default-cluster-lock-backend=Not_Valid"})
	if err == nil || !strings.Contains(err.Error(), `--default-cluster-lock-backend "Not_Valid" is not a valid object name`) {
		t.Fatalf("invalid name: %v, want an error naming the flag", err)
	}
}
