package redis

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
)

// chunkConn is a net.Conn whose reads return the given chunks, one per Read, then EOF.
type chunkConn struct {
	net.Conn // nil: only Read and Write are used
	chunks   [][]byte
	written  bytes.Buffer
}

func (c *chunkConn) Read(p []byte) (int, error) {
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	if n == len(c.chunks[0]) {
		c.chunks = c.chunks[1:]
	} else {
		c.chunks[0] = c.chunks[0][n:]
	}
	return n, nil
}

func (c *chunkConn) Write(p []byte) (int, error) { return c.written.Write(p) }

func (c *chunkConn) Close() error { return nil }

// readThrough reads data, cut into chunks at the given offsets, through
// LimitReplies and returns what came out and the first error other than EOF.
func readThrough(data []byte, limits Limits, cuts ...int) ([]byte, error) {
	var chunks [][]byte
	prev := 0
	for _, c := range cuts {
		if c > prev && c < len(data) {
			chunks = append(chunks, data[prev:c])
			prev = c
		}
	}
	chunks = append(chunks, data[prev:])
	conn := LimitReplies(&chunkConn{chunks: chunks}, limits)
	var out []byte
	buf := make([]byte, min(len(data)+1, 64<<10))
	for {
		n, err := conn.Read(buf)
		out = append(out, buf[:n]...)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

func bulk(s string) string { return fmt.Sprintf("$%d\r\n%s\r\n", len(s), s) }

// helloReply is redis-server 7's answer to HELLO 3.
const helloReply = "%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$6\r\n7.0.15\r\n$5\r\nproto\r\n:3\r\n" +
	"$2\r\nid\r\n:5\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n"

// validReplies are replies a Redis server sends (RESP2 and RESP3).
func validReplies() map[string]string {
	var info strings.Builder
	info.WriteString("# Server\r\nredis_version:7.0.15\r\n")
	for i := range 200 {
		fmt.Fprintf(&info, "key_%d:value_%d\r\n", i, i)
	}
	binary := make([]byte, 0, 300)
	for i := range 300 {
		binary = append(binary, byte(i))
	}
	return map[string]string{
		"status":             "+OK\r\n",
		"empty status":       "+\r\n",
		"error":              "-ERR unknown command 'FOO', with args beginning with: \r\n",
		"noauth":             "-NOAUTH Authentication required.\r\n",
		"integer":            ":0\r\n",
		"negative integer":   ":-42\r\n",
		"null bulk":          "$-1\r\n",
		"null array":         "*-1\r\n",
		"empty bulk":         "$0\r\n\r\n",
		"bulk":               bulk("hello"),
		"bulk with CRLF":     bulk("\r\n$5\r\n*1\r\n:\r\n-ERR\r\n"),
		"binary bulk":        bulk(string(binary)),
		"info":               bulk(info.String()),
		"empty array":        "*0\r\n",
		"eval nested":        "*4\r\n:1\r\n*2\r\n$1\r\na\r\n*1\r\n$1\r\nb\r\n$-1\r\n-ERR inner\r\n",
		"pubsub message":     "*3\r\n" + bulk("message") + bulk("{k}:released") + bulk("k"),
		"null":               "_\r\n",
		"double":             ",3.14\r\n",
		"inf":                ",inf\r\n",
		"bool":               "#t\r\n",
		"big number":         "(3492890328409238509324850943850943825024385\r\n",
		"verbatim":           "=15\r\ntxt:Some string\r\n",
		"blob error":         "!21\r\nSYNTAX invalid syntax\r\n",
		"map":                "%2\r\n+first\r\n:1\r\n+second\r\n:2\r\n",
		"empty map":          "%0\r\n",
		"null map":           "%-1\r\n",
		"set":                "~3\r\n+a\r\n+b\r\n+c\r\n",
		"push":               ">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\nhello\r\n",
		"hello 3":            helloReply,
		"attribute":          "|1\r\n+key-popularity\r\n%2\r\n$1\r\na\r\n,0.1923\r\n$1\r\nb\r\n,0.0012\r\n*2\r\n:2039123\r\n:9543892\r\n",
		"attribute in array": "*2\r\n|1\r\n+ttl\r\n:3600\r\n:1\r\n:2\r\n",
		"empty attribute":    "|0\r\n:1\r\n",
		"map of aggregates":  "%2\r\n$1\r\na\r\n*2\r\n:1\r\n%1\r\n+x\r\n~1\r\n_\r\n$1\r\nb\r\n*-1\r\n",
		"nested to depth":    strings.Repeat("*1\r\n", DefaultMaxDepth) + ":1\r\n",
		"largest bulk":       bulk(strings.Repeat("x", DefaultMaxBulk)),
		"longest line":       "+" + strings.Repeat("y", DefaultMaxLine-3) + "\r\n",
		"largest array":      fmt.Sprintf("*%d\r\n%s", DefaultMaxElements, strings.Repeat(":1\r\n", DefaultMaxElements)),
	}
}

func checkPassesEverySplit(t *testing.T, name string, data []byte) {
	t.Helper()
	v := newValidator(Limits{})
	if n, err := v.feed(data); err != nil || n != len(data) || !v.atBoundary() {
		t.Fatalf("%s: whole: accepted %d of %d bytes, boundary %v, err %v", name, n, len(data), v.atBoundary(), err)
	}
	if len(data) > 16<<10 {
		// Large replies: a sample of split points and random chunkings.
		r := rand.New(rand.NewPCG(1, uint64(len(data))))
		for range 8 {
			cuts := []int{r.IntN(len(data)), r.IntN(len(data)), r.IntN(len(data))}
			if out, err := readThrough(data, Limits{}, sortInts(cuts)...); err != nil || !bytes.Equal(out, data) {
				t.Fatalf("%s: cut at %v: err %v, bytes equal %v", name, cuts, err, bytes.Equal(out, data))
			}
		}
		return
	}
	for cut := 1; cut < len(data); cut++ {
		out, err := readThrough(data, Limits{}, cut)
		if err != nil || !bytes.Equal(out, data) {
			t.Fatalf("%s: split at %d: err %v, passed through %q, want %q", name, cut, err, out, data)
		}
	}
	// One byte per Read.
	cuts := make([]int, len(data))
	for i := range cuts {
		cuts[i] = i
	}
	if out, err := readThrough(data, Limits{}, cuts...); err != nil || !bytes.Equal(out, data) {
		t.Fatalf("%s: byte by byte: err %v", name, err)
	}
}

func sortInts(s []int) []int {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

func TestValidRepliesPassAtEveryReadBoundary(t *testing.T) {
	var all []byte
	for name, r := range validReplies() {
		checkPassesEverySplit(t, name, []byte(r))
		if len(r) <= 16<<10 {
			all = append(all, r...)
		}
	}
	// Pipelined: every small reply back to back.
	checkPassesEverySplit(t, "pipelined", all)
}

// replyRejection is what a test expects of a rejected reply stream.
type replyRejection struct {
	kind     error
	limit    string
	accepted int // bytes passed through before the error
}

func rejectedStreams() map[string]struct {
	data string
	want replyRejection
} {
	type c = struct {
		data string
		want replyRejection
	}
	ssh := "SSH-2.0-OpenSSH_9.6\r\n"
	return map[string]c{
		"ssh banner":              {ssh, replyRejection{ErrNotRedis, "", 0}},
		"http reply":              {"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", replyRejection{ErrNotRedis, "", 0}},
		"banner after a reply":    {"+OK\r\n" + ssh, replyRejection{ErrNotRedis, "", 5}},
		"bare CRLF":               {"\r\n", replyRejection{ErrNotRedis, "", 0}},
		"huge bulk":               {"$1073741824\r\n", replyRejection{ErrReplyTooLarge, "MaxBulk", 11}},
		"bulk one over":           {fmt.Sprintf("$%d\r\n", DefaultMaxBulk+1), replyRejection{ErrReplyTooLarge, "MaxBulk", 8}},
		"huge verbatim":           {"=1073741824\r\ntxt:", replyRejection{ErrReplyTooLarge, "MaxBulk", 11}},
		"huge blob error":         {"!1073741824\r\n", replyRejection{ErrReplyTooLarge, "MaxBulk", 11}},
		"huge array":              {"*2147483647\r\n", replyRejection{ErrReplyTooLarge, "MaxElements", 11}},
		"huge map":                {"%1048577\r\n", replyRejection{ErrReplyTooLarge, "MaxElements", 8}},
		"huge set":                {"~1048577\r\n", replyRejection{ErrReplyTooLarge, "MaxElements", 8}},
		"huge push":               {">1048577\r\n", replyRejection{ErrReplyTooLarge, "MaxElements", 8}},
		"huge attribute":          {"|1048577\r\n", replyRejection{ErrReplyTooLarge, "MaxElements", 8}},
		"huge nested array":       {"*1\r\n*2147483647\r\n", replyRejection{ErrReplyTooLarge, "MaxElements", 15}},
		"nested allocations":      {"*1048576\r\n*1048576\r\n*1048576\r\n", replyRejection{ErrReplyTooLarge, "MaxElements", 29}},
		"too deep":                {strings.Repeat("*1\r\n", DefaultMaxDepth+1), replyRejection{ErrReplyTooLarge, "MaxDepth", 4*DefaultMaxDepth + 3}},
		"long status":             {"+" + strings.Repeat("a", DefaultMaxLine), replyRejection{ErrReplyTooLarge, "MaxLine", DefaultMaxLine}},
		"long error":              {"-" + strings.Repeat("a", DefaultMaxLine) + "\r\n", replyRejection{ErrReplyTooLarge, "MaxLine", DefaultMaxLine}},
		"line one over":           {"+" + strings.Repeat("y", DefaultMaxLine-2) + "\r\n", replyRejection{ErrReplyTooLarge, "MaxLine", DefaultMaxLine}},
		"streamed string":         {"$?\r\n;4\r\nHell\r\n;0\r\n", replyRejection{ErrUnsupportedReply, "", 1}},
		"streamed array":          {"*?\r\n:1\r\n.\r\n", replyRejection{ErrUnsupportedReply, "", 1}},
		"stray chunk":             {";4\r\nHell\r\n", replyRejection{ErrUnsupportedReply, "", 0}},
		"letters in a length":     {"$abc\r\n", replyRejection{ErrNotRedis, "", 1}},
		"negative length":         {"$-2\r\n", replyRejection{ErrNotRedis, "", 2}},
		"bare minus":              {"*-\r\n", replyRejection{ErrNotRedis, "", 2}},
		"empty length":            {"$\r\n", replyRejection{ErrNotRedis, "", 1}},
		"header without CR":       {"$5\nhello\r\n", replyRejection{ErrNotRedis, "", 2}},
		"twenty digits":           {"$00000000000000000001\r\n", replyRejection{ErrNotRedis, "", 20}},
		"payload without CRLF":    {"$3\r\nfoo\n\n", replyRejection{ErrNotRedis, "", 7}},
		"payload too long":        {"$3\r\nfoobar\r\n", replyRejection{ErrNotRedis, "", 7}},
		"line without CR":         {"+OK\n", replyRejection{ErrNotRedis, "", 3}},
		"bad element in an array": {"*2\r\n:1\r\nSSH-2.0\r\n", replyRejection{ErrNotRedis, "", 8}},
	}
}

func TestRejectedStreamsAtEveryReadBoundary(t *testing.T) {
	for name, tc := range rejectedStreams() {
		data := []byte(tc.data)
		cuts := []int{0}
		if len(data) < 4096 {
			for i := 1; i < len(data); i++ {
				cuts = append(cuts, i)
			}
		} else {
			cuts = append(cuts, 1, tc.want.accepted, tc.want.accepted+1, len(data)-1)
		}
		for _, cut := range cuts {
			out, err := readThrough(data, Limits{}, cut)
			var re *ReplyError
			if !errors.As(err, &re) || !errors.Is(err, tc.want.kind) || re.Limit != tc.want.limit {
				t.Fatalf("%s (cut at %d): err = %v, want a *ReplyError matching %v with Limit %q", name, cut, err, tc.want.kind, tc.want.limit)
			}
			if len(out) != tc.want.accepted || !bytes.Equal(out, data[:len(out)]) || re.Offset != int64(tc.want.accepted) {
				t.Fatalf("%s (cut at %d): passed %d bytes, error at offset %d; want %d", name, cut, len(out), re.Offset, tc.want.accepted)
			}
			if strings.Contains(err.Error(), "SSH") || strings.Contains(err.Error(), "HTTP") {
				t.Fatalf("%s: the error repeats the peer's bytes: %v", name, err)
			}
		}
	}
}

func TestRejectedConnectionStaysUnusable(t *testing.T) {
	cc := &chunkConn{chunks: [][]byte{[]byte("+OK\r\n$1073741824\r\n"), []byte("+OK\r\n")}}
	conn := LimitReplies(cc, Limits{})
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	if err != nil || string(buf[:n]) != "+OK\r\n$1073741824" {
		t.Fatalf("first Read = %q, %v; want the bytes before the violation and no error yet", buf[:n], err)
	}
	for i := range 3 {
		if n, err := conn.Read(buf); n != 0 || !errors.Is(err, ErrReplyTooLarge) {
			t.Fatalf("Read %d after the violation = %d, %v; want 0 and ErrReplyTooLarge", i+2, n, err)
		}
	}
	if _, err := conn.Write([]byte("PING\r\n")); !errors.Is(err, ErrReplyTooLarge) {
		t.Fatalf("Write after the violation: %v, want ErrReplyTooLarge", err)
	}
	if cc.written.Len() != 0 {
		t.Fatalf("a Write after the violation reached the connection: %q", cc.written.String())
	}
}

func TestCustomLimits(t *testing.T) {
	lim := Limits{MaxBulk: 10, MaxElements: 3, MaxLine: 16, MaxDepth: 2}
	ok := []string{bulk("0123456789"), "*3\r\n:1\r\n:2\r\n:3\r\n", "+" + strings.Repeat("a", 13) + "\r\n", "*1\r\n*1\r\n:1\r\n"}
	for _, s := range ok {
		if out, err := readThrough([]byte(s), lim); err != nil || string(out) != s {
			t.Errorf("%q under %+v: %v", s, lim, err)
		}
	}
	bad := []struct {
		data  string
		lim   Limits
		limit string
	}{
		{bulk("0123456789a"), lim, "MaxBulk"},
		{"*4\r\n", lim, "MaxElements"},
		{"%4\r\n", lim, "MaxElements"},
		{"+" + strings.Repeat("a", 14) + "\r\n", lim, "MaxLine"},
		{"*1\r\n*1\r\n*1\r\n", lim, "MaxDepth"},
		// 3+3+3 elements announced and not received: more than 2*MaxElements.
		{"*3\r\n*3\r\n*3\r\n", Limits{MaxElements: 3}, "MaxElements"},
		{"%3\r\n%1\r\n", Limits{MaxElements: 3}, "MaxElements"},
	}
	for _, tc := range bad {
		_, err := readThrough([]byte(tc.data), tc.lim)
		var re *ReplyError
		if !errors.As(err, &re) || re.Limit != tc.limit {
			t.Errorf("%q under %+v: err %v, want Limit %s", tc.data, tc.lim, err, tc.limit)
		}
	}
}

// FuzzReadBoundaries: however a stream is cut into reads, the validator
// reaches the same verdict at the same offset, passes through exactly the
// accepted bytes, and never panics.
func FuzzReadBoundaries(f *testing.F) {
	for _, r := range validReplies() {
		if len(r) < 4096 {
			f.Add([]byte(r), uint16(len(r)/2), uint16(1))
		}
	}
	for _, r := range rejectedStreams() {
		if len(r.data) < 4096 {
			f.Add([]byte(r.data), uint16(3), uint16(len(r.data)-1))
		}
	}
	lim := Limits{MaxBulk: 64, MaxElements: 8, MaxLine: 32, MaxDepth: 4}
	f.Fuzz(func(t *testing.T, data []byte, cut1, cut2 uint16) {
		wholeOut, wholeErr := readThrough(data, lim)
		cutOut, cutErr := readThrough(data, lim, sortInts([]int{int(cut1), int(cut2)})...)
		if !bytes.Equal(wholeOut, data[:len(wholeOut)]) || !bytes.Equal(cutOut, data[:len(cutOut)]) {
			t.Fatal("the bytes passed through differ from the input")
		}
		var we, ce *ReplyError
		errors.As(wholeErr, &we)
		errors.As(cutErr, &ce)
		switch {
		case (we == nil) != (ce == nil):
			t.Fatalf("whole: %v; cut at %d, %d: %v", wholeErr, cut1, cut2, cutErr)
		case we != nil && (we.Offset != ce.Offset || !errors.Is(ce, we.kind) || we.Limit != ce.Limit || len(wholeOut) != len(cutOut)):
			t.Fatalf("whole: %v (%d bytes); cut at %d, %d: %v (%d bytes)", we, len(wholeOut), cut1, cut2, ce, len(cutOut))
		case we == nil && len(wholeOut) != len(data):
			t.Fatalf("accepted %d of %d bytes without an error", len(wholeOut), len(data))
		}
	})
}
