package shmcache

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// The contract's kinds (golden/contract.json) are this package's: the word of every kind
// errors.go declares (read from its source, so a kind added there is checked too), and
// "error", the word the command gives an error that is none of them.
func TestKindsAreTheContracts(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "golden", "contract.json"))
	if err != nil {
		t.Fatal(err)
	}
	var contract struct {
		Kinds []struct {
			Kind string `json:"kind"`
		} `json:"kinds"`
	}
	if err := json.Unmarshal(data, &contract); err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, k := range contract.Kinds {
		want = append(want, k.Kind)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{"error"}
	ast.Inspect(f, func(n ast.Node) bool {
		if lit, ok := n.(*ast.CompositeLit); ok {
			if id, ok := lit.Type.(*ast.Ident); ok && id.Name == "kind" && len(lit.Elts) > 1 {
				word, err := strconv.Unquote(lit.Elts[1].(*ast.BasicLit).Value)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Contains(got, word) {
					got = append(got, word)
				}
			}
		}
		return true
	})
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("errors.go's kinds %v, the contract's %v", got, want)
	}
}
