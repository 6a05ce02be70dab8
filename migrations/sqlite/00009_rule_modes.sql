-- +goose Up
-- envoyproxy/ratelimit's replaces (a JSON array of limit names) and
-- quota_mode, which an import of its files keeps on the rules they become.
ALTER TABLE rules ADD COLUMN replaces TEXT NOT NULL DEFAULT '[]';
ALTER TABLE rules ADD COLUMN quota_mode BOOLEAN NOT NULL DEFAULT FALSE
    CONSTRAINT rules_quota_mode_check CHECK (quota_mode IN (0, 1));

-- +goose Down
ALTER TABLE rules DROP COLUMN quota_mode;
ALTER TABLE rules DROP COLUMN replaces;
