package printable

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	cases := map[string]string{
		"maintenance-2026-12-01":      "maintenance-2026-12-01",
		`a\b "quoted" |pipes| ünï 日本`: `a\b "quoted" |pipes| ünï 日本`,
		"x\nforged row":               `x\nforged row`,
		"erase\x1b[2Kline":            `erase\x1b[2Kline`,
		"title\x1b]0;owned\x07":       `title\x1b]0;owned\a`,
		"tab\tcr\rnul\x00del\x7f":     `tab\tcr\rnul\x00del\x7f`,
		"bidi\u202eexe.gnp\u2066":     `bidi\u202eexe.gnp\u2066`,
		"zero\u200bwidth\u2028line":   `zero\u200bwidth\u2028line`,
		"nbsp\u00a0c1\u009b":          `nbsp\u00a0c1\u009b`,
		"bad\xffutf8":                 `bad\xffutf8`,
	}
	for in, want := range cases {
		if got := String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestBounded(t *testing.T) {
	cases := []struct {
		in    string
		limit int
		want  string
	}{
		{"short", 10, "short"},
		{"exactly10!", 10, "exactly10!"},
		{"eleven chars", 10, "eleven ..."},
		{"日本語日本語日本語日本語", 5, "日本..."},
		{"ab\ncd", 6, `ab\ncd`},
		// The escape \x1b does not fit whole before the mark: it is left out, not cut.
		{"abcd\x1befgh", 9, "abcd..."},
	}
	for _, c := range cases {
		got := Bounded(c.in, c.limit)
		if got != c.want {
			t.Errorf("Bounded(%q, %d) = %q, want %q", c.in, c.limit, got, c.want)
		}
		if n := utf8.RuneCountInString(got); n > c.limit {
			t.Errorf("Bounded(%q, %d) has %d characters", c.in, c.limit, n)
		}
	}
	long := strings.Repeat("\x1b", 10000)
	if got := Bounded(long, 512); utf8.RuneCountInString(got) > 512 || !strings.HasSuffix(got, `\x1b...`) {
		t.Errorf("Bounded of 10000 ESC bytes to 512 = %d characters ending %q", utf8.RuneCountInString(got), got[len(got)-10:])
	}
}
