// Package web holds the admin page for support staff: plain HTML, CSS and
// JavaScript modules, embedded in the binary and served by the api package
// at /admin/. The page has no build step and no assets from elsewhere, and
// talks to the service only through the public REST API, with a token its
// user pastes.
package web

import (
	"embed"
	"io/fs"
)

//go:embed static
var static embed.FS

// Files returns the page's files, with index.html at the root.
func Files() fs.FS {
	files, err := fs.Sub(static, "static")
	if err != nil {
		// fs.Sub fails only for an invalid directory name, and "static"
		// is a constant valid one.
		panic(err)
	}
	return files
}
