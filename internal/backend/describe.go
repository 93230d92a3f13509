package backend

import (
	"errors"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Describe says what went wrong with a lock's backend in words safe to show
// a tenant in a condition or an Event: the operator's own messages (policy
// refusals, missing Secrets, invalid configuration, lost leases) as they are,
// and failures that came from the network or the store as fixed categories
// per endpoint (Category), never the bytes a peer sent.
func Describe(err error) string {
	if err == nil {
		return ""
	}
	var pe *PolicyError
	var se *SecretError
	var ce *ConfigError
	var ne *lock.NodeError
	switch {
	case errors.As(err, &pe):
		return pe.Error()
	case errors.As(err, &se):
		return se.Error()
	case errors.As(err, &ce):
		return ce.Error()
	case errors.Is(err, ErrConnecting):
		return ErrConnecting.Error()
	case errors.Is(err, lock.ErrInvalidRequest):
		return err.Error() // the operator's and the engine's own words, naming the field
	case errors.Is(err, lock.ErrLost) || errors.Is(err, lock.ErrNotHeld):
		if !errors.As(err, &ne) {
			return err.Error() // the engine's and the operator's own words
		}
		return "lease lost; " + describeNodes(err)
	}
	return describeNodes(err)
}
