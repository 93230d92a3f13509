package controllers

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// TestNamespaceBudgetGivesTurnsInOrder: past its burst, a namespace's
// reconciles get its next turns in the order they asked; one that comes back
// early waits for its own turn (it takes no other), goes on at it, and the
// other namespaces are not counted against it.
func TestNamespaceBudgetGivesTurnsInOrder(t *testing.T) {
	b := newBudget(1, 1)
	t0 := time.Unix(1_000_000, 0)
	nn := func(ns, name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }
	steps := []struct {
		what string
		obj  types.NamespacedName
		at   time.Duration
		want time.Duration
	}{
		{"the burst", nn("busy", "a"), 0, 0},
		{"the next turn", nn("busy", "b"), 0, time.Second},
		{"the turn after", nn("busy", "c"), 0, 2 * time.Second},
		{"another namespace", nn("quiet", "a"), 0, 0},
		{"b back early: its own turn", nn("busy", "b"), 500 * time.Millisecond, 500 * time.Millisecond},
		{"b at its turn", nn("busy", "b"), time.Second, 0},
		{"b again: a new turn, after c's", nn("busy", "b"), time.Second, 2 * time.Second},
		{"c at its turn", nn("busy", "c"), 2 * time.Second, 0},
	}
	for _, s := range steps {
		if got := b.admit(s.obj, t0.Add(s.at)); got != s.want {
			t.Errorf("%s (%v at %v): wait %v, want %v", s.what, s.obj, s.at, got, s.want)
		}
	}
	b.forget(nn("busy", "b"))
	if _, kept := b.turns[nn("busy", "b")]; kept {
		t.Error("the turn of a forgotten object is kept")
	}
	if got := newNamespaceBudget(-1).admit(nn("busy", "x"), t0); got != 0 {
		t.Errorf("no bound: wait %v, want 0", got)
	}
}
