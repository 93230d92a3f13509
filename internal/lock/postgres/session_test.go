package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/lockwarden/lockwarden/internal/lock"
	"github.com/lockwarden/lockwarden/internal/testutil/rawserver"
)

// fakeServer speaks just enough of the protocol to log a client in (no
// authentication) and answer its simple queries: answer returns the rows
// (name, setting) of a query that reads pg_settings, or an error reply for
// the SETs when refuse is set.
func fakeServer(t *testing.T, settings map[string]string, refuse bool) *rawserver.Server {
	t.Helper()
	return rawserver.Start(t, func(c net.Conn) {
		be := pgproto3.NewBackend(c, c)
		if _, err := be.ReceiveStartupMessage(); err != nil {
			return
		}
		be.Send(&pgproto3.AuthenticationOk{})
		for k, v := range map[string]string{"server_version": "15.0", "client_encoding": "UTF8", "standard_conforming_strings": "on"} {
			be.Send(&pgproto3.ParameterStatus{Name: k, Value: v})
		}
		be.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}})
		be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		if be.Flush() != nil {
			return
		}
		for {
			msg, err := be.Receive()
			if err != nil {
				return
			}
			q, ok := msg.(*pgproto3.Query)
			if !ok {
				return // Terminate, or a message this fake does not speak
			}
			switch {
			case strings.Contains(q.String, "pg_settings"):
				be.Send(&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{
					{Name: []byte("name"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1},
					{Name: []byte("setting"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1},
				}})
				for k, v := range settings {
					be.Send(&pgproto3.DataRow{Values: [][]byte{[]byte(k), []byte(v)}})
				}
				be.Send(&pgproto3.CommandComplete{CommandTag: fmt.Appendf(nil, "SELECT %d", len(settings))})
			case refuse:
				be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "42704", Message: `unrecognized configuration parameter "idle_in_transaction_session_timeout"`})
			default:
				be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SET")})
			}
			be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
			if be.Flush() != nil {
				return
			}
		}
	})
}

// TestSessionSettingsNotKeptAreRefused: a server, or a pooler in front of
// one, that accepts the SETs but reports other values (a pooler in
// transaction mode whose next statement ran on another server connection),
// or refuses them, is not used: every call fails with an error that matches
// ErrSessionSettings and lock.ErrBackendUnavailable and names the setting.
func TestSessionSettingsNotKeptAreRefused(t *testing.T) {
	good := map[string]string{}
	for _, s := range sessionSettings(testOpTimeout) {
		good[s.name] = s.value
	}
	with := func(name, value string) map[string]string {
		m := map[string]string{}
		for k, v := range good {
			m[k] = v
		}
		if value == "" {
			delete(m, name)
		} else {
			m[name] = value
		}
		return m
	}
	cases := []struct {
		name     string
		settings map[string]string
		refuse   bool
		setting  string // the setting the error names; "" for a refusal
		text     string // in the error's text
	}{
		{"synchronous_commit off", with("synchronous_commit", "off"), false, "synchronous_commit", "acknowledged acquisitions"},
		{"synchronous_commit local", with("synchronous_commit", "local"), false, "synchronous_commit", "fencing tokens again"},
		{"no lock_timeout", with("lock_timeout", "0"), false, "lock_timeout", "server-side bound"},
		{"setting missing", with("statement_timeout", ""), false, "statement_timeout", "reads back as nothing"},
		{"SET refused", good, true, "", "unrecognized configuration parameter"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := fakeServer(t, tc.settings, tc.refuse)
			l := newTestLocker(t, Config{Host: srv.Host, Port: srv.Port, Database: "locks", User: "lockwarden"})
			ctx, cancel := context.WithTimeout(context.Background(), 2*testOpTimeout)
			defer cancel()
			_, acqErr := l.TryAcquire(ctx, lock.Request{Keys: []string{"k"}, TTL: 10 * time.Second})
			for op, err := range map[string]error{"Ping": l.Ping(ctx), "TryAcquire": acqErr} {
				var se *SessionSettingError
				if !errors.As(err, &se) || !errors.Is(err, ErrSessionSettings) || !errors.Is(err, lock.ErrBackendUnavailable) {
					t.Fatalf("%s: %v; want a *SessionSettingError matching ErrSessionSettings and lock.ErrBackendUnavailable", op, err)
				}
				if se.Setting != tc.setting || !strings.Contains(err.Error(), tc.text) || !strings.Contains(err.Error(), srv.Addr) {
					t.Fatalf("%s: %v; want it to name setting %q, say %q and name the endpoint %s", op, err, tc.setting, tc.text, srv.Addr)
				}
			}
			t.Logf("%v", acqErr)
		})
	}

	// The same fake with the settings kept: the connection is accepted (the
	// check is what refused it above).
	srv := fakeServer(t, good, false)
	l := newTestLocker(t, Config{Host: srv.Host, Port: srv.Port, Database: "locks", User: "lockwarden"})
	if err := l.Ping(context.Background()); err != nil {
		t.Fatalf("Ping of a server that keeps the settings: %v", err)
	}
}

func TestSessionSettingValues(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{2 * time.Second, "2000"},
		{1500 * time.Microsecond, "2"}, // rounded up
		{time.Nanosecond, "1"},         // never 0 (which disables a timeout)
		{1000 * time.Hour, "2147483647"},
	} {
		if got := millis(tc.d); got != tc.want {
			t.Errorf("millis(%v) = %s, want %s", tc.d, got, tc.want)
		}
	}
	got := map[string]string{}
	for _, s := range sessionSettings(2 * time.Second) {
		got[s.name] = s.value
	}
	want := map[string]string{"synchronous_commit": "on", "statement_timeout": "2000", "lock_timeout": "1000", "idle_in_transaction_session_timeout": "2000"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("sessionSettings(2s) = %v, want %v", got, want)
	}
}

// TestRenewBatches: a batch is split between leases into runs of at most
// renewBatchRows keys, in order, each lease in exactly one run.
func TestRenewBatches(t *testing.T) {
	var leases []*lock.Lease
	var idx []int
	for i := range 500 {
		keys := make([]string, 1+i%lock.MaxKeys)
		for j := range keys {
			keys[j] = fmt.Sprintf("k%d-%d", i, j)
		}
		leases = append(leases, &lock.Lease{Keys: keys})
		if i%7 != 3 { // some leases left out of idx, as invalid ones are
			idx = append(idx, i)
		}
	}
	batches := renewBatches(leases, idx)
	next := 0
	for b, batch := range batches {
		rows := 0
		for _, k := range batch {
			if k != next {
				t.Fatalf("batch %d holds position %d, want %d (in order, each once)", b, k, next)
			}
			next++
			rows += len(leases[idx[k]].Keys)
		}
		if rows > renewBatchRows || len(batch) == 0 {
			t.Fatalf("batch %d: %d leases, %d keys; want 1 or more leases and at most %d keys", b, len(batch), rows, renewBatchRows)
		}
	}
	if next != len(idx) {
		t.Fatalf("batches cover %d of %d leases", next, len(idx))
	}
	if one := renewBatches(leases, idx[:1]); len(one) != 1 || len(one[0]) != 1 {
		t.Fatalf("one lease: %v, want one batch", one)
	}
}
