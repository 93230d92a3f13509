package memory

// The faults of an in-memory store, for the fault suite's nemeses
// (locktest.Nemesis): a store that stalls, and one whose replies are lost.

// Pause stalls the store, as a server stopped with SIGSTOP: from now on the
// calls of its Lockers wait until Resume, and fail with an error matching
// lock.ErrBackendUnavailable and the context's error when their context ends
// first, having changed nothing. The store's clock runs on meanwhile, so
// leases and waiters expire. Pausing a paused store does nothing.
func (s *Store) Pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resumed == nil {
		s.resumed = make(chan struct{})
	}
}

// Resume ends a Pause: the calls waiting for the store run. Resuming a store
// that is not paused does nothing.
func (s *Store) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.resumed != nil {
		close(s.resumed)
		s.resumed = nil
	}
}

// DropReplies makes the store lose its replies until DeliverReplies, as a
// network path back to the clients that fails: every call still runs on the
// store (an acquisition is granted, a lease released) and then fails with an
// error matching lock.ErrBackendUnavailable; the release notifications meant
// for waiters and watchers meanwhile are lost, and Watch subscribes nothing.
func (s *Store) DropReplies() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropping = true
}

// DeliverReplies ends DropReplies.
func (s *Store) DeliverReplies() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropping = false
}
