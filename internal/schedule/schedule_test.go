package schedule

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestWindowIsReadInItsTimeZone: "0 1 * * *" in Europe/Berlin opens at
// 00:00 UTC in winter (CET, +1) and 23:00 UTC the day before in summer
// (CEST, +2), and stays open for its duration.
func TestWindowIsReadInItsTimeZone(t *testing.T) {
	h, err := Parse("0 1 * * *", "Europe/Berlin", 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	winter := time.Date(2027, 1, 10, 0, 30, 0, 0, time.UTC) // 01:30 in Berlin
	w, ok, next := h.At(winter)
	if !ok || !w.Start.Equal(time.Date(2027, 1, 10, 0, 0, 0, 0, time.UTC)) || !w.End.Equal(time.Date(2027, 1, 10, 2, 0, 0, 0, time.UTC)) {
		t.Fatalf("at %v: window %v-%v open %v, want 00:00-02:00 UTC", winter, w.Start.UTC(), w.End.UTC(), ok)
	}
	if !next.Equal(time.Date(2027, 1, 11, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("next start %v, want 2027-01-11 00:00 UTC", next.UTC())
	}
	summer := time.Date(2027, 7, 10, 0, 30, 0, 0, time.UTC) // 02:30 in Berlin
	w, ok, _ = h.At(summer)
	if !ok || !w.Start.Equal(time.Date(2027, 7, 9, 23, 0, 0, 0, time.UTC)) {
		t.Fatalf("at %v: window %v open %v, want from 23:00 UTC", summer, w.Start.UTC(), ok)
	}
	// Outside: 03:00 Berlin, the window has closed.
	w, ok, next = h.At(time.Date(2027, 1, 10, 2, 0, 0, 0, time.UTC))
	if ok {
		t.Fatalf("window %v still open at its end", w)
	}
	if !next.Equal(time.Date(2027, 1, 11, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("next start %v", next.UTC())
	}
}

// TestBadHoldsNameTheField: each bad hold is refused naming the field.
func TestBadHoldsNameTheField(t *testing.T) {
	from := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		schedule, zone string
		d              time.Duration
		field          string
	}{
		{"0 25 * * *", "UTC", time.Hour, "schedule"},
		{"every day", "UTC", time.Hour, "schedule"},
		{"0 0 1 * * *", "UTC", time.Hour, "schedule"}, // 6 fields
		{"@every 1h", "UTC", time.Minute, "schedule"},
		{"CRON_TZ=UTC 0 1 * * *", "", time.Hour, "schedule"},
		{"0 1 * * *", "Mars/Olympus", time.Hour, "timeZone"},
		{"0 1 * * *", "Local", time.Hour, "timeZone"},
		{"0 1 * * *", "UTC", 0, "durationSeconds"},
		{"0 1 * * *", "UTC", 24 * time.Hour, "durationSeconds"},
		{"0 1,2 * * *", "UTC", 90 * time.Minute, "durationSeconds"},
	} {
		err := Validate(tc.schedule, tc.zone, tc.d, from)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Detail, " ") {
			t.Errorf("Validate(%q, %q, %v) = %v, want an error on %s", tc.schedule, tc.zone, tc.d, err, tc.field)
		}
	}
	if err := Validate("0 1 * * *", "Europe/Berlin", 2*time.Hour, from); err != nil {
		t.Errorf("a valid hold refused: %v", err)
	}
	if err := Validate("@weekly", "", 23*time.Hour, from); err != nil {
		t.Errorf("a valid hold refused: %v", err)
	}
}
