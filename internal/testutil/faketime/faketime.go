// Package faketime finds libfaketime, which the clock fault tests preload
// into a store server to set its wall clock off (zktest, pgtest), and
// formats the offsets it reads.
package faketime

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// Hint says how to get libfaketime.
const Hint = "run hack/ensure-faketime.sh (or: sudo apt-get install faketime), or set LOCKWARDEN_FAKETIME_LIB to libfaketime.so.1"

// libs are where Debian and Ubuntu install libfaketime.
var libs = []string{
	"/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
	"/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
	"/usr/lib/faketime/libfaketime.so.1",
}

// Lib returns the path of libfaketime, or an error that says how to install it.
func Lib() (string, error) {
	cands := libs
	if p := os.Getenv("LOCKWARDEN_FAKETIME_LIB"); p != "" {
		cands = []string{p}
	}
	for _, p := range cands {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() { //nolint:gosec // G703: a library path from the test environment, only checked for existence
			return p, nil
		}
	}
	return "", fmt.Errorf("libfaketime not found (looked for %v): %s", cands, Hint)
}

// Require skips t when libfaketime is missing, or fails it when
// LOCKWARDEN_REQUIRE_SERVERS is set.
func Require(t testing.TB) {
	t.Helper()
	if _, err := Lib(); err != nil {
		if os.Getenv("LOCKWARDEN_REQUIRE_SERVERS") != "" {
			t.Fatalf("LOCKWARDEN_REQUIRE_SERVERS is set but %v", err)
		}
		t.Skip(err)
	}
}

// Offset is libfaketime's relative offset d ("+12.000", "-0.500"): the
// real clock plus d, running at the real rate.
func Offset(d time.Duration) string {
	sign := "+"
	if d < 0 {
		sign, d = "-", -d
	}
	return sign + strconv.FormatFloat(d.Seconds(), 'f', 3, 64)
}
