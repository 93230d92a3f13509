package freeport

import (
	"sync"
	"testing"
)

// TestNoPortTwice takes ports from many goroutines at once: none is handed
// out twice while it is held.
func TestNoPortTwice(t *testing.T) {
	const workers, each = 8, 25
	var (
		wg     sync.WaitGroup
		seenMu sync.Mutex
		seen   = map[int]bool{}
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				p, err := Take()
				if err != nil {
					t.Error(err)
					return
				}
				seenMu.Lock()
				if seen[p] {
					t.Errorf("port %d handed out twice", p)
				}
				seen[p] = true
				seenMu.Unlock()
			}
		}()
	}
	wg.Wait()
	ports, err := TakeN(10)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if seen[p] {
			t.Errorf("TakeN handed out port %d again", p)
		}
		seen[p] = true
	}
	for p := range seen {
		Give(p)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(taken) != 0 {
		t.Errorf("%d ports still taken after Give", len(taken))
	}
}

func TestClaim(t *testing.T) {
	p, err := Take()
	if err != nil {
		t.Fatal(err)
	}
	if Claim(p) {
		t.Fatalf("Claim(%d) of a port Take handed out succeeded", p)
	}
	Give(p)
	if !Claim(p) {
		t.Fatalf("Claim(%d) of a port given back failed", p)
	}
	if Claim(p) {
		t.Fatalf("second Claim(%d) succeeded", p)
	}
	Give(p)
}
