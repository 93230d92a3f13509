package lock

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAcquisitionsPrepareEveryRequest: TryAcquire and Acquire hand the
// store's attempt and wait a prepared request (an owner token filled in, the
// keys copied), after the store's own check; a request either refuses never
// reaches the store.
func TestAcquisitionsPrepareEveryRequest(t *testing.T) {
	refused := &InvalidRequestError{Field: "keys", Reason: "too long for this store"}
	var got []Request
	a := Acquisitions[int]{
		Check: func(req Request) error {
			if req.Keys[0] == "long" {
				return refused
			}
			return nil
		},
		Attempt: func(_ context.Context, req Request) (*Lease, int, error) {
			got = append(got, req)
			return &Lease{Keys: req.Keys, Owner: req.Owner}, 7, nil
		},
		Wait: func(_ context.Context, req Request) (*Lease, error) {
			got = append(got, req)
			return &Lease{Keys: req.Keys, Owner: req.Owner}, nil
		},
	}
	ctx := context.Background()
	keys := []string{"k"}
	if _, err := a.TryAcquire(ctx, Request{Keys: keys, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, Request{Keys: keys, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Owner == "" || got[1].Owner == "" {
		t.Fatalf("the store saw %+v; want two prepared requests with owner tokens", got)
	}
	got[0].Keys[0] = "changed"
	if keys[0] != "k" {
		t.Fatal("the store's request shares the caller's key slice")
	}
	var ire *InvalidRequestError
	for _, req := range []Request{
		{Keys: []string{"long"}, TTL: time.Second},                      // the store's check
		{Keys: []string{"k"}, TTL: time.Millisecond},                    // below the minimum TTL
		{Keys: []string{"k"}, TTL: time.Second, Queue: true, Owner: ""}, // TryAcquire only
	} {
		before := len(got)
		if _, err := a.TryAcquire(ctx, req); !errors.As(err, &ire) {
			t.Errorf("TryAcquire(%+v) = %v; want an InvalidRequestError", req, err)
		}
		if len(got) != before {
			t.Errorf("TryAcquire(%+v) reached the store", req)
		}
	}
	if _, err := a.Acquire(ctx, Request{Keys: []string{"long"}, TTL: time.Second}); !errors.Is(err, refused) {
		t.Errorf("Acquire of a request the store refuses: %v", err)
	}
}

// TestAcquisitionsRefuseWeightsUnlessTheStoreTakesThem: a weight above 1
// never reaches a store that does not take weighted requests; one that
// does gets it, and the lease says its weight.
func TestAcquisitionsRefuseWeightsUnlessTheStoreTakesThem(t *testing.T) {
	reached := 0
	attempt := func(_ context.Context, req Request) (*Lease, int, error) {
		reached++
		return &Lease{Keys: req.Keys, Owner: req.Owner}, 0, nil
	}
	req := Request{Keys: []string{"k"}, TTL: time.Second, Limit: 4, Weight: 3}
	plain := Acquisitions[int]{Attempt: attempt}
	var ire *InvalidRequestError
	if _, err := plain.TryAcquire(context.Background(), req); !errors.As(err, &ire) || ire.Field != "weight" || reached != 0 {
		t.Fatalf("weight 3 on a store without weights: %v (reached the store %d times); want an InvalidRequestError on field weight", err, reached)
	}
	weighted := Acquisitions[int]{Attempt: attempt, Weights: true}
	lease, err := weighted.TryAcquire(context.Background(), req)
	if err != nil || lease.Weight != 3 {
		t.Fatalf("weight 3 on a store with weights: lease %+v, %v; want a lease of weight 3", lease, err)
	}
	req.Weight = 0
	if lease, err = plain.TryAcquire(context.Background(), req); err != nil || lease.Weight != 1 {
		t.Fatalf("weight 0 on a store without weights: lease %+v, %v; want a lease of weight 1", lease, err)
	}
}
