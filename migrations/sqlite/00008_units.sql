-- +goose Up
-- A limit may count something other than requests: tokens of a language
-- model, bytes, seconds. Existing limits counted requests. SQLite has no
-- regular expressions; the service checks the unit's form.
ALTER TABLE limits ADD COLUMN unit TEXT NOT NULL DEFAULT 'requests'
    CONSTRAINT limits_unit_check CHECK (length(unit) BETWEEN 1 AND 32);

-- +goose Down
ALTER TABLE limits DROP COLUMN unit;
