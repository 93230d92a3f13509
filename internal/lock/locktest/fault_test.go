package locktest

import (
	"errors"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// TestFencedRegisterModelRejectsStaleHistories shows that the checker used
// by the fault test can fail: a token that goes backwards, or a stale write
// that was accepted, makes the history illegal.
func TestFencedRegisterModelRejectsStaleHistories(t *testing.T) {
	op := func(client int, call, ret int64, in regInput, out regOutput) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: in, Output: out}
	}
	cases := map[string]struct {
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		"fenced handover": {want: porcupine.Ok, ops: []porcupine.Operation{
			op(0, 0, 1, regInput{op: opAcquire}, regOutput{fence: 10, accepted: true}),
			op(0, 2, 3, regInput{op: opWrite, fence: 10, value: 1}, regOutput{accepted: true}),
			op(1, 4, 5, regInput{op: opAcquire}, regOutput{fence: 20, accepted: true}),
			op(0, 6, 7, regInput{op: opWrite, fence: 10, value: 2}, regOutput{accepted: false}),
			op(1, 8, 9, regInput{op: opRead}, regOutput{value: 1, fence: 20}),
		}},
		"token goes backwards after a restart": {want: porcupine.Illegal, ops: []porcupine.Operation{
			op(0, 0, 1, regInput{op: opAcquire}, regOutput{fence: 20, accepted: true}),
			op(1, 2, 3, regInput{op: opAcquire}, regOutput{fence: 5, accepted: false}),
		}},
		"stale write accepted": {want: porcupine.Illegal, ops: []porcupine.Operation{
			op(0, 0, 1, regInput{op: opAcquire}, regOutput{fence: 10, accepted: true}),
			op(1, 2, 3, regInput{op: opAcquire}, regOutput{fence: 20, accepted: true}),
			op(0, 4, 5, regInput{op: opWrite, fence: 10, value: 2}, regOutput{accepted: true}),
		}},
	}
	for name, tc := range cases {
		if got := porcupine.CheckOperationsTimeout(fencedRegisterModel, tc.ops, 10*time.Second); got != tc.want {
			t.Errorf("%s: check = %s, want %s", name, got, tc.want)
		}
	}
}

// TestCheckExclusionRejectsOverlappingLeases shows that the exclusion check
// of every fault run can fail: two leases valid at one instant (three, for a
// semaphore of two slots) are a violation, leases that meet end to start are
// not.
func TestCheckExclusionRejectsOverlappingLeases(t *testing.T) {
	v := func(client int, fence, from, to int64) validity {
		return validity{client: client, fence: fence, from: from, to: to}
	}
	cases := map[string]struct {
		limit   int
		vs      []validity
		wantAt  int64 // the instant of the violation; -1: none
		wantLen int
	}{
		"handover end to start": {limit: 1, wantAt: -1, vs: []validity{v(0, 1, 0, 10), v(1, 2, 10, 20), v(0, 3, 20, 30)}},
		"renewal gap":           {limit: 1, wantAt: -1, vs: []validity{v(0, 1, 0, 10), v(1, 2, 12, 20), v(0, 1, 21, 30)}},
		"second holder while the first is valid": {limit: 1, wantAt: 5, wantLen: 2, vs: []validity{
			v(0, 1, 0, 10), v(1, 2, 5, 20),
		}},
		"stale lease outlives the next one": {limit: 1, wantAt: 15, wantLen: 2, vs: []validity{
			v(0, 1, 0, 10), v(1, 2, 10, 20), v(0, 1, 15, 16),
		}},
		"semaphore full":      {limit: 2, wantAt: -1, vs: []validity{v(0, 1, 0, 10), v(1, 2, 5, 20), v(2, 3, 10, 30)}},
		"semaphore over full": {limit: 2, wantAt: 9, wantLen: 3, vs: []validity{v(0, 1, 0, 10), v(1, 2, 5, 20), v(2, 3, 9, 30)}},
	}
	for name, tc := range cases {
		err := checkExclusion(tc.vs, tc.limit)
		var ex *ExclusionError
		switch {
		case tc.wantAt < 0 && err != nil:
			t.Errorf("%s: %v, want no violation", name, err)
		case tc.wantAt >= 0 && !errors.As(err, &ex):
			t.Errorf("%s: %v, want an exclusion violation at %d", name, err, tc.wantAt)
		case tc.wantAt >= 0 && (ex.At != time.Duration(tc.wantAt) || len(ex.Valid) != tc.wantLen):
			t.Errorf("%s: violation at %v with %d leases (%v), want at %v with %d", name, ex.At, len(ex.Valid), ex, time.Duration(tc.wantAt), tc.wantLen)
		}
	}
}
