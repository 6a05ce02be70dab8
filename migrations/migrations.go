// Package migrations holds the database schema of ratelimitd as goose SQL
// migrations, one set per engine, embedded in the binary so that a deployed
// service can bring its database up to date without files beside it.
//
// Each file makes one logical change and is numbered sequentially
// (00001_..., 00002_...). The two sets describe the same tables; Postgres
// gets its native types, named constraints and column comments, SQLite the
// nearest types it has.
package migrations

import (
	"embed"
	"io/fs"
)

//go:embed postgres/*.sql sqlite/*.sql
var files embed.FS

// Postgres returns the migrations for Postgres, rooted at the files.
func Postgres() fs.FS { return sub("postgres") }

// SQLite returns the migrations for SQLite, rooted at the files.
func SQLite() fs.FS { return sub("sqlite") }

func sub(dir string) fs.FS {
	f, err := fs.Sub(files, dir)
	if err != nil {
		// fs.Sub fails only for an invalid path, and dir is a constant.
		panic(err)
	}
	return f
}
