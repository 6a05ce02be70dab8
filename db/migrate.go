package db

import (
	"context"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
)

// migrationSet is an engine's migrations and how goose runs them.
type migrationSet struct {
	dialect goose.Dialect
	files   fs.FS
	opts    []goose.ProviderOption
}

func (d *DB) provider() (*goose.Provider, error) {
	m, err := d.be.migrations()
	if err != nil {
		return nil, fmt.Errorf("database: loading migrations: %w", err)
	}
	// The global registry holds Go migrations registered by init functions;
	// this schema has none, and no other package's may leak in.
	opts := append([]goose.ProviderOption{goose.WithDisableGlobalRegistry(true)}, m.opts...)
	p, err := goose.NewProvider(m.dialect, d.writer, m.files, opts...)
	if err != nil {
		return nil, fmt.Errorf("database: loading migrations: %w", err)
	}
	return p, nil
}

// Migrate applies the pending migrations of the engine's embedded set. On
// Postgres it runs under goose's session-level advisory lock, so that
// replicas starting together apply each migration once while the others
// wait; on SQLite the single writing connection serialises it.
func (d *DB) Migrate(ctx context.Context) error {
	p, err := d.provider()
	if err != nil {
		return err
	}
	results, err := p.Up(ctx)
	for _, r := range results {
		d.log.InfoContext(ctx, "database migration applied", "engine", d.Engine(),
			"version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
	}
	if err != nil {
		return fmt.Errorf("database: migrating: %w", d.fail(ctx, err))
	}
	return nil
}

// MigrationVersion returns the version the database is at and the latest
// version of the embedded set; they are equal when nothing is pending. On a
// database never migrated it creates goose's empty version table, and
// current is 0.
func (d *DB) MigrationVersion(ctx context.Context) (current, latest int64, err error) {
	p, err := d.provider()
	if err != nil {
		return 0, 0, err
	}
	current, latest, err = p.GetVersions(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("database: reading the migration version: %w", d.fail(ctx, err))
	}
	return current, latest, nil
}
