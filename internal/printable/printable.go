// Package printable shows text that lockwarden did not write itself (what a
// lock's backend holds, which whoever can write the backend chooses; a
// status written by another version) safely: on a terminal, in a table, in a
// condition or an Event.
package printable

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// String returns s with every character that is not printable replaced by
// its Go escape: control characters (ESC as \x1b, a line break as \n, a tab
// as \t), Unicode format and separator characters such as bidi overrides
// (\u202e) and line separators, and bytes that are not UTF-8 (\xff).
// Printable text, spaces and backslashes included, is returned unchanged.
func String(s string) string {
	if printable(s) {
		return s
	}
	var b strings.Builder
	escape(s, func(piece string) bool {
		b.WriteString(piece)
		return true
	})
	return b.String()
}

// Bounded is String cut to at most limit characters (runes, as an OpenAPI
// maxLength counts them), ending with "..." when cut. An escape is never
// cut in two.
func Bounded(s string, limit int) string {
	e := String(s)
	if utf8.RuneCountInString(e) <= limit {
		return e
	}
	const mark = "..."
	room := max(limit-len(mark), 0)
	var b strings.Builder
	n := 0
	escape(s, func(piece string) bool {
		pn := utf8.RuneCountInString(piece)
		if n+pn > room {
			return false
		}
		b.WriteString(piece)
		n += pn
		return true
	})
	b.WriteString(mark[:min(len(mark), limit)])
	return b.String()
}

// escape calls emit with each piece of s, in order: a printable character
// as it is, any other as its escape, until emit returns false.
func escape(s string, emit func(piece string) bool) {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		var piece string
		switch {
		case r == utf8.RuneError && size == 1:
			piece = fmt.Sprintf(`\x%02x`, s[i])
		case strconv.IsPrint(r):
			piece = s[i : i+size]
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\n', '\u202e'
			piece = q[1 : len(q)-1]
		}
		if !emit(piece) {
			return
		}
		i += size
	}
}

// printable reports whether every character of s is printable.
func printable(s string) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || !strconv.IsPrint(r) {
			return false
		}
		i += size
	}
	return true
}
