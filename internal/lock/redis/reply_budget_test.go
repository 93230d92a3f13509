package redis

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// TestRESP2RefusesRESP3Types: a connection that asked for RESP2 refuses
// every RESP3-only type, the map and set headers go-redis would size a map or
// slice by among them, and passes RESP2's own.
func TestRESP2RefusesRESP3Types(t *testing.T) {
	lim := Limits{RESP2: true}
	for _, s := range []string{"+OK\r\n", "-ERR no\r\n", ":12\r\n", bulk("v"), "$-1\r\n", "*-1\r\n", "*2\r\n:1\r\n" + bulk("x")} {
		if out, err := readThrough([]byte(s), lim); err != nil || string(out) != s {
			t.Errorf("RESP2 reply %q: %v", s, err)
		}
	}
	for _, s := range []string{"%1048576\r\n", "~3\r\n", ">3\r\n", "|1\r\n", "_\r\n", ",1.5\r\n", "(1\r\n", "#t\r\n", "=5\r\ntxt:a\r\n", "!3\r\nERR\r\n", "*1\r\n%1\r\n"} {
		_, err := readThrough([]byte(s), lim)
		if !errors.Is(err, ErrUnsupportedReply) {
			t.Errorf("RESP3 reply %q on a RESP2 connection: %v, want ErrUnsupportedReply", s, err)
		}
	}
}

// TestReplyBudget: the replies in flight on every connection sharing a
// budget announce no more than it together; a complete reply, a rejected
// stream and a closed connection each return their share.
func TestReplyBudget(t *testing.T) {
	b := lock.NewReplyBudget(1 << 20)
	lim := Limits{Budget: b}
	// A complete reply returns its share.
	if out, err := readThrough([]byte("*2\r\n"+bulk("abc")+bulk("de")), lim); err != nil || len(out) == 0 {
		t.Fatalf("a small reply: %v", err)
	}
	if b.InUse() != 0 {
		t.Fatalf("after a complete reply the budget holds %d bytes, want 0", b.InUse())
	}

	// Two connections each announce 600 KiB and send nothing more: the
	// second is refused, naming the budget.
	header := fmt.Sprintf("$%d\r\n", 600<<10)
	first := LimitReplies(&chunkConn{chunks: [][]byte{[]byte(header)}}, lim)
	buf := make([]byte, 64)
	if _, err := first.Read(buf); err != nil {
		t.Fatalf("the first announcement: %v", err)
	}
	if got := b.InUse(); got != 600<<10 {
		t.Fatalf("budget in use %d, want %d", got, 600<<10)
	}
	second := LimitReplies(&chunkConn{chunks: [][]byte{[]byte(header)}}, lim)
	_, err := readAll(second)
	var re *ReplyError
	if !errors.As(err, &re) || re.Limit != "Budget" || !errors.Is(err, ErrReplyTooLarge) {
		t.Fatalf("the second announcement over the budget: %v, want a ReplyError with Limit Budget", err)
	}
	if got := b.InUse(); got != 600<<10 {
		t.Fatalf("after the refusal the budget holds %d bytes, want the first connection's %d", got, 600<<10)
	}
	// Nested aggregates count per element announced.
	third := LimitReplies(&chunkConn{chunks: [][]byte{[]byte("*40000\r\n")}}, lim)
	if _, err := readAll(third); !errors.As(err, &re) || re.Limit != "Budget" {
		t.Fatalf("an aggregate of 40000 elements (640,000 bytes) over the 424 KiB left: %v, want Limit Budget", err)
	}
	// Closing the first connection returns its share.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if b.InUse() != 0 {
		t.Fatalf("after the connection closed the budget holds %d bytes, want 0", b.InUse())
	}
}

// readAll reads until an error; EOF reads as nil.
func readAll(c io.Reader) ([]byte, error) {
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}
