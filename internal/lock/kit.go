package lock

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
)

// The settings every store shares.
const (
	// DefaultWaiterTTL is how long a queued waiter keeps its place without
	// calling TryAcquire again.
	DefaultWaiterTTL = 30 * time.Second
	// MinWaiterTTL is the shortest waiter TTL a Locker accepts.
	MinWaiterTTL = 100 * time.Millisecond
)

// DefaultBackoff is Acquire's fallback polling when no wake-up comes: 10ms
// doubling to at most 1s, each step with up to 50% jitter.
var DefaultBackoff = wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 1 << 30, Cap: time.Second}

// ErrInvalidConfig is matched (errors.Is) by every *ConfigError.
var ErrInvalidConfig = errors.New("invalid lock configuration")

// ConfigError names the Config field or option of a store that is wrong and
// what would be valid.
type ConfigError struct {
	// Store is the store's name ("redis", "etcd", ...).
	Store string
	// Field is the Config field (servers[1], Prefix, ...) or option
	// (WithWaiterTTL, ...).
	Field string
	// Reason says what is wrong and what is accepted.
	Reason string
}

// Error names the store and the field and says what is valid.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("invalid %s lock configuration: %s: %s", e.Store, e.Field, e.Reason)
}

// Is makes a ConfigError match ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// Options are the settings every store's Locker takes. A store embeds them
// in its own options and sets them through its With... options.
type Options struct {
	// Clock reads the time of leases (Acquired, Expires) and, when it is a
	// clock.Clock, times Acquire's waits. Default: the real clock.
	Clock clock.PassiveClock
	// Log is the Locker's logger. Default: logr.Discard().
	Log logr.Logger
	// Backoff is Acquire's fallback polling between attempts when no
	// wake-up comes (exponential with jitter; Cap bounds the wait; Steps is
	// ignored). A wake-up resets it. Default: DefaultBackoff.
	Backoff wait.Backoff
	// WaiterTTL is how long a queued waiter keeps its place without calling
	// again; Acquire calls at least every third of it. Default:
	// DefaultWaiterTTL; at least MinWaiterTTL.
	WaiterTTL time.Duration
	// CleanupTimeout bounds leaving the queues after Acquire's ctx ends
	// (the store sets it from its per-call timeout).
	CleanupTimeout time.Duration
}

// DefaultOptions returns the shared defaults.
func DefaultOptions() Options {
	return Options{Clock: clock.RealClock{}, Log: logr.Discard(), Backoff: DefaultBackoff, WaiterTTL: DefaultWaiterTTL, CleanupTimeout: time.Second}
}

// Validate checks the shared settings; the error is a *ConfigError of store
// naming the option (WithClock, WithWaiterTTL, WithBackoff).
func (o *Options) Validate(store string) error {
	switch {
	case o.Clock == nil:
		return &ConfigError{Store: store, Field: "WithClock", Reason: "the clock must not be nil"}
	case o.WaiterTTL < MinWaiterTTL:
		return &ConfigError{Store: store, Field: "WithWaiterTTL", Reason: fmt.Sprintf("%v is below the minimum of %v", o.WaiterTTL, MinWaiterTTL)}
	case o.Backoff.Duration <= 0:
		return &ConfigError{Store: store, Field: "WithBackoff", Reason: fmt.Sprintf("Duration %v must be positive", o.Backoff.Duration)}
	case o.Backoff.Factor != 0 && o.Backoff.Factor < 1:
		return &ConfigError{Store: store, Field: "WithBackoff", Reason: fmt.Sprintf("Factor %v must be 0 (constant) or at least 1", o.Backoff.Factor)}
	case o.CleanupTimeout <= 0:
		return &ConfigError{Store: store, Field: "CleanupTimeout", Reason: fmt.Sprintf("%v: must be positive", o.CleanupTimeout)}
	}
	if o.Backoff.Steps <= 0 {
		o.Backoff.Steps = 1 << 30
	}
	return nil
}

// NewTimer starts a timer on the Clock when it has timers (a fake clock's
// waits then follow the test), and on the real clock otherwise.
func (o *Options) NewTimer(d time.Duration) (<-chan time.Time, func()) {
	if c, ok := o.Clock.(clock.Clock); ok {
		t := c.NewTimer(d)
		return t.C(), func() { t.Stop() }
	}
	t := time.NewTimer(d)
	return t.C, func() { t.Stop() }
}

// backoffSteps is Backoff without its jitter, which AcquireDelay adds after
// the cap.
func (o *Options) backoffSteps() wait.Backoff {
	b := o.Backoff
	b.Jitter = 0
	if b.Steps <= 0 {
		b.Steps = 1 << 30
	}
	return b
}

// Now reads the Clock.
func (o *Options) Now() time.Time { return o.Clock.Now() }

// Since is the time elapsed since t on the Clock.
func (o *Options) Since(t time.Time) time.Duration { return o.Clock.Since(t) }

// Until is the time left until t on the Clock.
func (o *Options) Until(t time.Time) time.Duration { return t.Sub(o.Clock.Now()) }

// AfterFunc runs f in its own goroutine after d on the Clock when it has
// timers (a fake clock's then fire when the test steps it), and on the real
// clock otherwise. stop cancels it, reporting whether it had not run yet.
func (o *Options) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	if c, ok := o.Clock.(clock.WithDelayedExecution); ok {
		return c.AfterFunc(d, f).Stop
	}
	return time.AfterFunc(d, f).Stop
}
