-- +goose Up
-- A name is the actor of the changes its token makes, so two live tokens
-- with one name would make the audit trail ambiguous. Live duplicates
-- made before this change keep the oldest token's name; the others get
-- their id appended.
UPDATE tokens SET name = name || ' (' || id || ')'
WHERE revoked_at IS NULL
  AND EXISTS (SELECT 1 FROM tokens older
              WHERE older.name = tokens.name AND older.revoked_at IS NULL AND older.id < tokens.id);

-- Names are unique among live tokens; a revoked token's name may be given
-- again.
CREATE UNIQUE INDEX tokens_live_name_key ON tokens (name) WHERE revoked_at IS NULL;

-- +goose Down
DROP INDEX tokens_live_name_key;
