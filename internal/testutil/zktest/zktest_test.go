package zktest

import (
	"testing"
	"time"
)

// TestEnsembleLeaderFailover starts three servers, kills the leader, waits for
// the others to elect a new one, restarts the old leader and pauses a follower.
func TestEnsembleLeaderFailover(t *testing.T) {
	start := time.Now()
	e := StartEnsemble(t, 3)
	t.Logf("ensemble serving after %v", time.Since(start))
	old, err := e.Leader()
	if err != nil {
		t.Fatal(err)
	}
	old.Kill()
	if err := e.WaitLeader(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	next, err := e.Leader()
	if err != nil {
		t.Fatal(err)
	}
	if next == old {
		t.Fatalf("server %d still leads after it was killed", old.ID)
	}
	if err := old.Restart(); err != nil {
		t.Fatal(err)
	}
	if m, err := old.Mode(); err != nil || m != ModeFollower {
		t.Fatalf("restarted old leader: mode %q, %v; want follower", m, err)
	}
	f := e.Followers()[0]
	if err := f.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Mode(); err == nil {
		t.Fatalf("paused server %d answered srvr", f.ID)
	}
	if err := f.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := e.WaitLeader(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("done after %v", time.Since(start))
}

func TestStandalone(t *testing.T) {
	s := Start(t)
	if m, err := s.Mode(); err != nil || m != ModeStandalone {
		t.Fatalf("mode %q, %v; want standalone", m, err)
	}
	if out, err := s.FourLetter("ruok"); err != nil || out != "imok\n" {
		t.Fatalf("ruok: %q, %v", out, err)
	}
}
