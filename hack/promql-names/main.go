// promql-names parses PromQL expressions with Prometheus' own parser and says, for each, the
// metric names it selects and, when it is an alert's `signal > threshold`, the signal alone.
//
// Input (stdin): a JSON array of expressions. Output (stdout): a JSON array, one object per
// expression, in order: {"error": "...", "metrics": [...], "signal": "..."}. Exit status 0 even
// when an expression does not parse: the caller reports every error at once.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type result struct {
	Error   string   `json:"error,omitempty"`
	Metrics []string `json:"metrics"`
	Signal  string   `json:"signal,omitempty"`
}

func names(expr parser.Expr) []string {
	seen := map[string]bool{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		if vs, ok := node.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName {
					if m.Type == labels.MatchEqual {
						name = m.Value
					} else {
						name = "{__name__" + m.Type.String() + m.Value + "}"
					}
				}
			}
			seen[name] = true
		}
		return nil
	})
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// signal is the left side of `<vector> <cmp> <number>` (without `bool`): what an alert compares.
func signal(expr parser.Expr) string {
	for {
		paren, ok := expr.(*parser.ParenExpr)
		if !ok {
			break
		}
		expr = paren.Expr
	}
	bin, ok := expr.(*parser.BinaryExpr)
	if !ok || !bin.Op.IsComparisonOperator() || bin.ReturnBool {
		return ""
	}
	if _, isNumber := bin.RHS.(*parser.NumberLiteral); !isNumber {
		return ""
	}
	return bin.LHS.String()
}

func main() {
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Fprintln(os.Stderr, "promql-names: stdin is not a JSON array of strings:", err)
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	results := make([]result, 0, len(exprs))
	for _, text := range exprs {
		expr, err := p.ParseExpr(text)
		if err != nil {
			results = append(results, result{Error: err.Error(), Metrics: []string{}})
			continue
		}
		results = append(results, result{Metrics: names(expr), Signal: signal(expr)})
	}
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, "promql-names:", err)
		os.Exit(1)
	}
}
