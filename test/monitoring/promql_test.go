package monitoring

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// PromQL's words that look like metric names but are not: aggregation
// operators (whose parameters may follow "by (...)" rather than "("), set
// and comparison modifiers, and number literals. Functions are recognised by
// the "(" that follows them.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "atan2": true,
	"by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "bool": true, "offset": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true,
	"stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true,
	"quantile": true, "limitk": true, "limit_ratio": true,
	"inf": true, "nan": true,
}

var (
	// promqlString is a quoted string: label values, label_replace's arguments.
	promqlString = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	// promqlComment runs from # to the end of the line.
	promqlComment = regexp.MustCompile(`#[^\n]*`)
	// promqlBraces and promqlBrackets are label matchers and range or
	// subquery selectors (strings are gone by then, so no brace is quoted).
	promqlBraces   = regexp.MustCompile(`\{[^{}]*\}`)
	promqlBrackets = regexp.MustCompile(`\[[^\[\]]*\]`)
	// promqlLabelList is a list of label names after a modifier: by (le),
	// on(namespace, lock), group_left(kind).
	promqlLabelList = regexp.MustCompile(`(?i)\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	// promqlToken is a Grafana variable, a number or duration (5m, 1e3,
	// 0.95), or an identifier followed by what comes next.
	promqlToken = regexp.MustCompile(`\$\{?[A-Za-z0-9_]+\}?|[0-9][0-9A-Za-z_.]*|([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?`)
)

// metricNames returns the metric names an expression selects, sorted and
// without repeats: every identifier that is not a function, a keyword, a
// label name in a matcher or modifier list, or inside a string. Grafana's
// variables ($namespace, ${lock}, $__rate_interval) are ignored. Names are
// returned as written (a histogram's _bucket series stays _bucket).
func metricNames(expr string) []string {
	s := promqlString.ReplaceAllString(expr, `""`)
	s = promqlComment.ReplaceAllString(s, " ")
	s = promqlBraces.ReplaceAllString(s, " ")
	s = promqlBrackets.ReplaceAllString(s, " ")
	s = promqlLabelList.ReplaceAllString(s, " ")
	var names []string
	for _, m := range promqlToken.FindAllStringSubmatch(s, -1) {
		name, call := m[1], m[2]
		if name == "" || call != "" || promqlKeywords[strings.ToLower(name)] {
			continue
		}
		names = append(names, name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func TestMetricNames(t *testing.T) {
	cases := map[string]struct {
		expr string
		want []string
	}{
		"a bare name": {
			expr: "lockwarden_leases_held",
			want: []string{"lockwarden_leases_held"},
		},
		"matchers and a Grafana variable": {
			expr: `lockwarden_lock_holders{namespace=~"$namespace", lock=~"${lock}"}`,
			want: []string{"lockwarden_lock_holders"},
		},
		"a quantile over buckets": {
			expr: `histogram_quantile(0.99, sum by (kind, le) (rate(lockwarden_wait_seconds_bucket[$__rate_interval])))`,
			want: []string{"lockwarden_wait_seconds_bucket"},
		},
		"a ratio with a regexp matcher that looks like a name": {
			expr: "sum by (webhook) (rate(controller_runtime_webhook_requests_total{code!~\"2..\"}[5m]))\n  / sum by (webhook) (rate(controller_runtime_webhook_requests_total[5m])) > 0.05",
			want: []string{"controller_runtime_webhook_requests_total"},
		},
		"time, and, offsets and exponents": {
			expr: `time() - lockwarden_queue_oldest_waiter_timestamp_seconds offset 1h > 1e3 and lockwarden_queue_depth > 0`,
			want: []string{"lockwarden_queue_depth", "lockwarden_queue_oldest_waiter_timestamp_seconds"},
		},
		"vector matching modifiers": {
			expr: `lockwarden_queue_depth * on(namespace, lock) group_left(kind) lockwarden_backend_up unless ignoring (lock) lockwarden_lock_holders`,
			want: []string{"lockwarden_backend_up", "lockwarden_lock_holders", "lockwarden_queue_depth"},
		},
		"aggregation parameters after the clause, and a subquery": {
			expr: `topk without (lock) (3, max_over_time(lockwarden_queue_depth[1h:5m]))`,
			want: []string{"lockwarden_queue_depth"},
		},
		"strings with spaces, parentheses and braces": {
			expr: `label_replace(up{job="a b"}, "x", "$1 (y) {z}", "job", "(.*)")`,
			want: []string{"up"},
		},
		"a comment": {
			expr: "lockwarden_leases_held # not_a_metric here\n",
			want: []string{"lockwarden_leases_held"},
		},
		"colons in recording rule names": {
			expr: `lockwarden:acquisitions:rate5m > bool 1`,
			want: []string{"lockwarden:acquisitions:rate5m"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, metricNames(tc.expr)); diff != "" {
				t.Errorf("metricNames(%q) (-want,+got):\n%s", tc.expr, diff)
			}
		})
	}
}
