package pgtest

// Launch starts one server without a testing.TB, for programs and suites
// that own a server for longer than one test (`make dev BACKEND=postgres`,
// the end-to-end suite): the caller must Close it. It fails when the binaries
// are missing (BinDir's error says how to install them). On error the
// returned server (when not nil) holds whatever was started: Close it too.
func Launch(opts ...Option) (*Server, error) {
	cfg := config{password: DefaultPassword}
	for _, o := range opts {
		o(&cfg)
	}
	return launchNew(cfg)
}

// LogPath returns the server's log file (stdout and stderr of the
// postmaster), removed by Close.
func (s *Server) LogPath() string { return s.logPath }
