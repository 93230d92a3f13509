package locktest

import (
	"bufio"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// echoServer accepts connections on a loopback port and echoes each line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends a line on c and reads the echo before deadline.
func roundTrip(c net.Conn, r *bufio.Reader, deadline time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(deadline)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err := r.ReadString('\n')
	return err
}

// TestLinkNemesesBreakAndHeal shows that the network nemeses do what the
// fault tests rely on: a black hole stops the bytes of an open connection
// (a read times out) and then lets them through again; a partition resets
// open connections and refuses new ones, and heals on the same address.
func TestLinkNemesesBreakAndHeal(t *testing.T) {
	link := NewLink(t, echoServer(t))
	c, err := net.Dial("tcp", link.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	r := bufio.NewReader(c)
	if err := roundTrip(c, r, 5*time.Second); err != nil {
		t.Fatalf("through the healthy link: %v", err)
	}

	heal := link.Drop()
	if err := roundTrip(c, r, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("through the black hole: %v, want a timeout", err)
	}
	heal()
	// The dropped line is gone with its connection; a new one works again.
	c2, err := net.Dial("tcp", link.Addr())
	if err != nil {
		t.Fatalf("dial after the black hole: %v", err)
	}
	defer func() { _ = c2.Close() }()
	r2 := bufio.NewReader(c2)
	if err := roundTrip(c2, r2, 5*time.Second); err != nil {
		t.Fatalf("after the black hole healed: %v", err)
	}

	addr := link.Addr()
	heal = link.Cut()
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		_ = c.Close()
		t.Fatal("a new connection was accepted during the partition")
	}
	if err := roundTrip(c2, r2, 2*time.Second); err == nil {
		t.Fatal("an open connection still answered during the partition")
	}
	heal()
	if link.Addr() != addr {
		t.Fatalf("the link moved from %s to %s", addr, link.Addr())
	}
	c3, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial after the partition healed: %v", err)
	}
	defer func() { _ = c3.Close() }()
	if err := roundTrip(c3, bufio.NewReader(c3), 5*time.Second); err != nil {
		t.Fatalf("after the partition healed: %v", err)
	}
}

// firstInjected returns the nemesis a run with seed injects first: "short"
// or "long" (listed in that order).
func firstInjected(t *testing.T, seed uint64, listedFirst bool) string {
	t.Helper()
	first := make(chan string, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	note := func(name string) func(context.Context, *rand.Rand) {
		return func(context.Context, *rand.Rand) {
			select {
			case first <- name:
				cancel()
			default:
			}
		}
	}
	var wg sync.WaitGroup
	injectFaults(ctx, &wg, Faults{
		FaultGap:    time.Millisecond,
		ListedFirst: listedFirst,
		Nemeses:     []Nemesis{{Name: "short", Inject: note("short")}, {Name: "long", Inject: note("long")}},
	}, seed)
	wg.Wait()
	return <-first
}

// TestListedFirst shows that Faults.ListedFirst makes every run begin with
// the first nemesis listed, and (the control) that without it some seeds
// begin with the other: the ZooKeeper fault runs rely on it to inject a
// short nemesis before one that may outlast the run.
func TestListedFirst(t *testing.T) {
	seeded := map[string]int{}
	for seed := range uint64(32) {
		if got := firstInjected(t, seed, true); got != "short" {
			t.Fatalf("seed %d with ListedFirst: the run began with %q, want the first listed", seed, got)
		}
		seeded[firstInjected(t, seed, false)]++
	}
	if seeded["long"] == 0 || seeded["short"] == 0 {
		t.Fatalf("without ListedFirst 32 seeds began with %v: the order is not seeded, so ListedFirst changes nothing", seeded)
	}
}
