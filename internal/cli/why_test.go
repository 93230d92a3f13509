package cli

import (
	"strings"
	"testing"
)

// why writes its sentences one a line; text from annotations and status in
// them cannot add lines or control the terminal.
func TestWhyLinesAreEscaped(t *testing.T) {
	var out strings.Builder
	if err := writeLines(&out, []string{"It waits behind: x\nfake\x1b[2K.", "Lock l is held by x\ny\u202e."}); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "It waits behind: x\\nfake\\x1b[2K.\nLock l is held by x\\ny\\u202e.\n"; got != want {
		t.Errorf("why printed %q, want %q", got, want)
	}
}
