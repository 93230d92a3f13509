// Package keyfrom derives a workload's lock key from its metadata with the
// CEL expressions of a DistributedLock's spec.keyFrom.
package keyfrom

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"

	locksv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/backend"
)

const (
	// CostLimit bounds the evaluation cost of one expression (CEL's cost
	// units: about one per operation, a string's length for a comparison or
	// a concatenation). A derived key is a few lookups and a concatenation:
	// far below it; an expression that loops over every label of a large
	// object is stopped.
	CostLimit = 10_000
	// DefaultMaxKeys is spec.maxKeys when it is not set.
	DefaultMaxKeys = 100
	// maxPrograms bounds the cache of compiled expressions.
	maxPrograms = 1024
)

// Workload is what the expressions see of a workload.
type Workload struct {
	Namespace, Name, GenerateName string
	Labels, Annotations           map[string]string
	// OwnerKind and OwnerName name the workload's controller ("" when none).
	OwnerKind, OwnerName string
}

func (w Workload) vars() map[string]any {
	labels, annotations := w.Labels, w.Annotations
	if labels == nil {
		labels = map[string]string{}
	}
	if annotations == nil {
		annotations = map[string]string{}
	}
	return map[string]any{
		"object": map[string]any{"metadata": map[string]any{
			"namespace": w.Namespace, "name": w.Name, "generateName": w.GenerateName,
			"labels": labels, "annotations": annotations,
		}},
		"owner": map[string]any{"kind": w.OwnerKind, "name": w.OwnerName},
	}
}

// Program is a lock's compiled spec.keyFrom.
type Program struct {
	expression, matches string
	key, guard          cel.Program
}

var (
	envOnce sync.Once
	env     *cel.Env
	envErr  error

	mu    sync.Mutex
	cache = map[locksv1alpha1.KeyFrom]*Program{}
)

func celEnv() (*cel.Env, error) {
	envOnce.Do(func() {
		env, envErr = cel.NewEnv(
			cel.Variable("object", cel.MapType(cel.StringType, cel.DynType)),
			cel.Variable("owner", cel.MapType(cel.StringType, cel.StringType)),
			ext.Strings(), // lowerAscii, replace, split, join, substring...
		)
	})
	return env, envErr
}

// Compile compiles kf, or says which field is wrong and why, in words a
// lock's author can act on. Compiled programs are cached by expression.
func Compile(kf *locksv1alpha1.KeyFrom) (*Program, error) {
	if kf == nil {
		return nil, errors.New("spec.keyFrom is not set")
	}
	mu.Lock()
	p, ok := cache[*kf]
	mu.Unlock()
	if ok {
		return p, nil
	}
	e, err := celEnv()
	if err != nil {
		return nil, err
	}
	p = &Program{expression: kf.Expression, matches: kf.Matches}
	if p.key, err = compile(e, kf.Expression, cel.StringType, "spec.keyFrom.expression", "a string, the key"); err != nil {
		return nil, err
	}
	if kf.Matches != "" {
		if p.guard, err = compile(e, kf.Matches, cel.BoolType, "spec.keyFrom.matches", "a bool"); err != nil {
			return nil, err
		}
	}
	mu.Lock()
	if len(cache) >= maxPrograms {
		clear(cache) // locks are few; a full cache is rebuilt on demand
	}
	cache[*kf] = p
	mu.Unlock()
	return p, nil
}

func compile(e *cel.Env, src string, want *cel.Type, field, what string) (cel.Program, error) {
	ast, iss := e.Compile(src)
	if iss.Err() != nil {
		return nil, fmt.Errorf("%s: `%s` does not compile: %s; the variables are object.metadata (namespace, name, generateName, labels, annotations) and owner (kind, name)",
			field, src, strings.ReplaceAll(iss.Err().Error(), "\n", " "))
	}
	if t := ast.OutputType(); !t.IsExactType(want) && !t.IsExactType(cel.DynType) {
		return nil, fmt.Errorf("%s: `%s` gives a %s, want %s", field, src, t, what)
	}
	cost, err := e.EstimateCost(ast, sizes{})
	if err != nil {
		return nil, fmt.Errorf("%s: `%s`: estimating its cost: %w", field, src, err)
	}
	if cost.Max > CostLimit {
		return nil, fmt.Errorf("%s: `%s` may cost up to %d units on a large workload, more than the limit of %d: use a few lookups and concatenations rather than loops over labels or annotations", field, src, cost.Max, CostLimit)
	}
	prg, err := e.Program(ast, cel.CostLimit(CostLimit), cel.InterruptCheckFrequency(100))
	if err != nil {
		return nil, fmt.Errorf("%s: `%s`: %w", field, src, err)
	}
	return prg, nil
}

// sizes bounds what the cost estimate assumes of a workload's metadata:
// up to maxEntries labels or annotations, strings of up to maxString
// characters (a label value has at most 63; annotations are longer).
type sizes struct{}

const (
	maxEntries = 256
	maxString  = 1024
)

func (sizes) EstimateSize(element checker.AstNode) *checker.SizeEstimate {
	switch element.Type().Kind() {
	case types.StringKind, types.DynKind:
		// A dyn is a value of the metadata: a string, or a map of them.
		return &checker.SizeEstimate{Min: 0, Max: maxString}
	case types.MapKind, types.ListKind:
		return &checker.SizeEstimate{Min: 0, Max: maxEntries}
	}
	return nil
}

func (sizes) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}

// Key derives w's key. The error names the lock, the expression and what
// failed (a missing label, a guard that is false, a result that is no key),
// for the admission of w to quote.
func (p *Program) Key(lock string, w Workload) (string, error) {
	vars := w.vars()
	if p.guard != nil {
		out, _, err := p.guard.Eval(vars)
		if err != nil {
			return "", fmt.Errorf("lock %s: spec.keyFrom.matches `%s` failed: %w", lock, p.matches, err)
		}
		if ok, isBool := out.Value().(bool); !isBool || !ok {
			msg := fmt.Sprintf("lock %s admits only workloads for which spec.keyFrom.matches `%s` is true, and this one does not match it (labels: %s)", lock, p.matches, labelList(w.Labels))
			if _, _, err := p.key.Eval(vars); err != nil {
				// Say what the key lacks, too: usually a missing label.
				msg += fmt.Sprintf("; its key `%s` fails: %v", p.expression, err)
			}
			return "", errors.New(msg + "; set the labels it asks for")
		}
	}
	out, _, err := p.key.Eval(vars)
	if err != nil {
		return "", fmt.Errorf("lock %s derives the key with `%s`, which failed for this workload: %w (labels: %s)", lock, p.expression, err, labelList(w.Labels))
	}
	if out.Type() != types.StringType {
		return "", fmt.Errorf("lock %s derives the key with `%s`, which gave a %s for this workload, not a string", lock, p.expression, out.Type().TypeName())
	}
	key, _ := out.Value().(string)
	if err := backend.ValidKey(key); err != nil {
		return "", fmt.Errorf("lock %s derives the key with `%s`, which gave %q for this workload, a key that is %w", lock, p.expression, key, err)
	}
	return key, nil
}

// labelList shows a workload's label names for an error message.
func labelList(labels map[string]string) string {
	if len(labels) == 0 {
		return "none"
	}
	names := make([]string, 0, len(labels))
	for k := range labels {
		names = append(names, k)
	}
	slices.Sort(names)
	if len(names) > 10 {
		names = append(names[:10], "...")
	}
	return strings.Join(names, ", ")
}

// MaxKeys is dl's spec.maxKeys, or its default.
func MaxKeys(dl *locksv1alpha1.DistributedLock) int {
	if dl.Spec.MaxKeys > 0 {
		return int(dl.Spec.MaxKeys)
	}
	return DefaultMaxKeys
}
