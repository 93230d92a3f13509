// Package schedule computes the windows of a DistributedLock's recurring
// holds (spec.holds): a 5-field cron schedule, read in an IANA time zone,
// opens a window of a fixed duration at each of its times.
//
// The admission webhook and the lock reconciler parse holds with the same
// functions, so that what the webhook admits is what the operator runs.
package schedule

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// parser reads the standard 5 fields (minute hour day-of-month month
// day-of-week) and the descriptors @yearly, @monthly, @weekly, @daily and
// @hourly.
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// periodSamples is how many consecutive window starts Validate compares to
// find a schedule's shortest period: more than a year of a daily schedule.
const periodSamples = 400

// Window is one opening of a hold: [Start, End).
type Window struct {
	Start, End time.Time
}

// Hold is a parsed recurring hold.
type Hold struct {
	schedule cron.Schedule
	duration time.Duration
	location *time.Location
}

// FieldError is a hold that cannot be used: Field names the field of the
// hold that is wrong (schedule, timeZone, durationSeconds), Detail what is
// wrong and what would be valid.
type FieldError struct {
	Field, Detail string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

// Parse reads a hold: schedule in the 5-field cron syntax, its times read in
// timeZone (an IANA name such as Europe/Berlin; empty means UTC), each
// window open for duration.
func Parse(schedule, timeZone string, duration time.Duration) (*Hold, error) {
	loc, err := Location(timeZone)
	if err != nil {
		return nil, err
	}
	s := strings.TrimSpace(schedule)
	if strings.HasPrefix(s, "TZ=") || strings.HasPrefix(s, "CRON_TZ=") {
		return nil, &FieldError{Field: "schedule", Detail: fmt.Sprintf("%q: name the time zone in timeZone, not in the schedule", schedule)}
	}
	if strings.HasPrefix(s, "@every") {
		return nil, &FieldError{Field: "schedule", Detail: fmt.Sprintf("%q: @every is not supported; use the 5 cron fields (minute hour day-of-month month day-of-week), for example \"0 1 * * *\"", schedule)}
	}
	sched, err := parser.Parse(s)
	if err != nil {
		return nil, &FieldError{Field: "schedule", Detail: fmt.Sprintf("%q is not a cron schedule (%v): give 5 fields, minute hour day-of-month month day-of-week, for example \"0 1 * * *\" for 01:00 every day, or @daily, @weekly", schedule, err)}
	}
	spec, ok := sched.(*cron.SpecSchedule)
	if !ok {
		return nil, &FieldError{Field: "schedule", Detail: fmt.Sprintf("%q is not a 5-field cron schedule", schedule)}
	}
	spec.Location = loc
	if duration <= 0 {
		return nil, &FieldError{Field: "durationSeconds", Detail: "must be at least 1: how long each window stays open, in seconds"}
	}
	return &Hold{schedule: spec, duration: duration, location: loc}, nil
}

// Location loads an IANA time zone; empty is UTC.
func Location(name string) (*time.Location, error) {
	if name == "" {
		return time.UTC, nil
	}
	if name == "Local" {
		// time.LoadLocation reads the operator's own zone for "Local":
		// a lock must not depend on where the operator runs.
		return nil, &FieldError{Field: "timeZone", Detail: `"Local" is not allowed: name an IANA time zone such as Europe/Berlin or UTC`}
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, &FieldError{Field: "timeZone", Detail: fmt.Sprintf("%q is not a known IANA time zone: give a name such as Europe/Berlin, America/New_York or UTC", name)}
	}
	return loc, nil
}

// Validate parses a hold and checks that its windows cannot overlap: the
// duration must be shorter than the shortest time between two consecutive
// starts (found over the next periodSamples starts after from).
func Validate(schedule, timeZone string, duration time.Duration, from time.Time) error {
	h, err := Parse(schedule, timeZone, duration)
	if err != nil {
		return err
	}
	prev := h.schedule.Next(from)
	if prev.IsZero() {
		return &FieldError{Field: "schedule", Detail: fmt.Sprintf("%q never fires", schedule)}
	}
	shortest := time.Duration(0)
	for range periodSamples {
		next := h.schedule.Next(prev)
		if next.IsZero() {
			break
		}
		if d := next.Sub(prev); shortest == 0 || d < shortest {
			shortest = d
		}
		prev = next
	}
	if shortest > 0 && duration >= shortest {
		return &FieldError{Field: "durationSeconds", Detail: fmt.Sprintf("%d is not shorter than the schedule's shortest period (%v, %d s): windows would overlap; give at most %d",
			int64(duration/time.Second), shortest, int64(shortest/time.Second), int64(shortest/time.Second)-1)}
	}
	return nil
}

// At returns the window open at now (ok false when none is) and the start
// of the next window that opens after it (or after now): zero when the
// schedule never fires again.
func (h *Hold) At(now time.Time) (open Window, ok bool, next time.Time) {
	// A window open at now started in (now-duration, now]. Starts are
	// whole seconds, and Next returns the first start strictly after its
	// argument.
	for t := h.schedule.Next(now.Add(-h.duration)); !t.IsZero() && !t.After(now); t = h.schedule.Next(t) {
		end := t.Add(h.duration)
		if !ok {
			open, ok = Window{Start: t, End: end}, true
		} else if end.After(open.End) {
			open.End = end // overlapping windows (Validate refuses them) join
		}
	}
	next = h.schedule.Next(now)
	for ok && !next.IsZero() && next.Before(open.End) {
		next = h.schedule.Next(next)
	}
	return open, ok, next
}

// Duration is how long each window stays open.
func (h *Hold) Duration() time.Duration { return h.duration }

// Location is the time zone the schedule is read in.
func (h *Hold) Location() *time.Location { return h.location }
