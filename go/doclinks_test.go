package shmcache

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// docsURL is where the packages' documentation links to the repository's docs/ (doc.go).
const docsURL = "https://github.com/shmcache/shmcache/blob/main/docs/"

var (
	docLink  = regexp.MustCompile(`https://github\.com/shmcache/shmcache/blob/main/docs/([^\s#)]+)(#[^\s)]*)?`)
	relative = regexp.MustCompile(`\.\./docs/`)
	heading  = regexp.MustCompile(`(?m)^#+ (.+)$`)
)

// slug is GitHub's anchor of a heading: lower case, every character but letters, digits,
// spaces, '-' and '_' dropped, each space a '-'.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// The packages' documentation works outside the repository: no link is relative
// (../docs/...), and every link to the docs names a page of docs/ and, with an anchor, one
// of its headings.
func TestDocLinksWorkOutsideTheRepo(t *testing.T) {
	var files []string
	for _, dir := range []string{".", "txmeta", "cmd/shmcache-go", "cmd/txmeta-validate"} {
		m, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		files = append(files, m...)
	}
	links := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if relative.Match(src) {
			t.Errorf("%s links to ../docs/, which does not resolve outside the repository: use %s", f, docsURL)
		}
		for _, m := range docLink.FindAllStringSubmatch(string(src), -1) {
			links++
			page, err := os.ReadFile(filepath.Join("../docs", m[1]))
			if err != nil {
				t.Errorf("%s links to %s: no such page in docs/", f, m[0])
				continue
			}
			if m[2] == "" {
				continue
			}
			found := false
			for _, h := range heading.FindAllStringSubmatch(string(page), -1) {
				found = found || "#"+slug(h[1]) == m[2]
			}
			if !found {
				t.Errorf("%s links to %s: docs/%s has no heading of that anchor", f, m[0], m[1])
			}
		}
	}
	if links == 0 {
		t.Fatal("no link to the docs found: the package documentation should link to them")
	}
}
