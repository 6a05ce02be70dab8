package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// configBlock is a fenced block of docs/gateways.md in one of the
// gateways' configuration languages, which must show a configuration as
// it is in gateways/.
var configBlock = regexp.MustCompile("(?ms)^```(nginx|caddyfile|haproxy|lua|yaml)\n(.*?)^```")

// TestGatewayDocs checks that every configuration docs/gateways.md shows
// is an excerpt, verbatim, of a file of gateways/, which the e2e tests
// run: the page cannot drift from what is tested.
func TestGatewayDocs(t *testing.T) {
	page, err := os.ReadFile("../docs/gateways.md")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	err = filepath.WalkDir("gateways", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		files = append(files, string(b))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	blocks := configBlock.FindAllStringSubmatch(string(page), -1)
	if len(blocks) == 0 {
		t.Fatal("docs/gateways.md shows no configuration")
	}
next:
	for _, b := range blocks {
		for _, f := range files {
			if strings.Contains(f, b[2]) {
				continue next
			}
		}
		t.Errorf("docs/gateways.md shows a %s block that no file of gateways/ holds as it is:\n%s", b[1], b[2])
	}
}
