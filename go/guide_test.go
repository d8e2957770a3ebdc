package shmcache

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The Go snippets of the docs compile and do what they show: each is either the body of a
// godoc example (marked `<!-- go: PACKAGE.ExampleName -->` on the line before it), which
// go vet compiles and go test runs, equal to it word for word (a tab as 4 spaces), or a
// whole file (it starts with `package`), compiled here by go vet in a module of its own
// with a replace to this checkout.

var (
	snippet = regexp.MustCompile("(?s)(?:<!-- go: ([\\w.]+) -->\\n)?```go\\n(.*?)```")
	guides  = []string{"../docs/go.md", "../docs/teranode.md"}
	// where each package's examples are
	exampleFiles = map[string]string{"shmcache": "example_test.go", "txmeta": "txmeta/example_test.go"}
)

// exampleBody is the body of func name in file, one tab less indented, tabs as 4 spaces.
func exampleBody(t *testing.T, file, name string) string {
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	head := "\nfunc " + name + "() {\n"
	i := strings.Index(string(src), head)
	if i < 0 {
		return ""
	}
	rest := string(src[i+len(head):])
	lines := strings.Split(rest[:strings.Index(rest, "\n}\n")], "\n")
	for k, l := range lines {
		lines[k] = strings.ReplaceAll(strings.TrimPrefix(l, "\t"), "\t", "    ")
	}
	return strings.Join(lines, "\n") + "\n"
}

func TestGuideSnippetsAreExamples(t *testing.T) {
	checked := 0
	for _, guide := range guides {
		doc, err := os.ReadFile(guide)
		if err != nil {
			t.Fatal(err)
		}
		for k, m := range snippet.FindAllStringSubmatch(string(doc), -1) {
			marker, code := m[1], m[2]
			where := fmt.Sprintf("%s, Go snippet %d", guide, k+1)
			switch {
			case strings.HasPrefix(code, "package "):
				compileFile(t, where, code)
			case marker == "":
				t.Errorf("%s is neither an example's body (no <!-- go: PACKAGE.ExampleName --> before it) "+
					"nor a whole file:\n%s", where, code)
			default:
				pkg, name, _ := strings.Cut(marker, ".")
				body := exampleBody(t, exampleFiles[pkg], name)
				if body == "" {
					t.Errorf("%s: no example %s in %s", where, name, exampleFiles[pkg])
				} else if body != code {
					t.Errorf("%s is not %s's body; the example says:\n%s", where, marker, body)
				}
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no Go snippet found in the guides")
	}
}

// compileFile vets code as the one file of a module that requires this checkout's reader.
func compileFile(t *testing.T, where, code string) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("%s: no go command to compile it", where)
	}
	here, _ := filepath.Abs(".")
	dir := t.TempDir()
	mod := "module example.com/snippet\n\ngo 1.23\n\nrequire github.com/shmcache/shmcache/go v0.0.0\n\n" +
		"replace github.com/shmcache/shmcache/go => " + here + "\n"
	sum, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"go.mod": []byte(mod), "go.sum": sum, "snippet.go": []byte(code)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(goTool, "vet", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s does not compile: %v\n%s", where, err, out)
	}
}
