-- +goose Up
-- A limit may count something other than requests: tokens of a language
-- model, bytes, seconds. Existing limits counted requests.
ALTER TABLE limits ADD COLUMN unit text NOT NULL DEFAULT 'requests',
    ADD CONSTRAINT limits_unit_check CHECK (unit ~ '^[a-z][a-z0-9_-]{0,31}$');

COMMENT ON COLUMN limits.unit IS 'What a token of the limit counts (requests, tokens, bytes, ...), for people and metrics; the GCRA does not read it.';

-- +goose Down
ALTER TABLE limits DROP COLUMN unit;
