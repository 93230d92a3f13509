package locktest

import (
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
