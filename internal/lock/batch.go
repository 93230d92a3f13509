package lock

import "context"

// BatchInspector is a Locker that can inspect the keys of many locks in as
// few round trips as the backend allows (one per node), rather than one
// Inspect call per lock. It is optional: InspectMany falls back to Inspect.
type BatchInspector interface {
	// InspectMany reports, for each set of keys, what Inspect would: the
	// states of those keys, or an error, by index. keys[i] follows the
	// rules of Inspect's keys.
	InspectMany(ctx context.Context, keys [][]string) ([][]KeyState, []error)
}

// InspectMany inspects each set of keys through l: in one batch when l is a
// BatchInspector, else with one Inspect call per set.
func InspectMany(ctx context.Context, l Locker, keys [][]string) ([][]KeyState, []error) {
	if b, ok := l.(BatchInspector); ok {
		return b.InspectMany(ctx, keys)
	}
	states := make([][]KeyState, len(keys))
	errs := make([]error, len(keys))
	for i, k := range keys {
		if err := ctx.Err(); err != nil {
			errs[i] = err
			continue
		}
		states[i], errs[i] = l.Inspect(ctx, k)
	}
	return states, errs
}
