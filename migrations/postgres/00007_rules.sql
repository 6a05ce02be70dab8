-- +goose Up
CREATE TABLE rules (
    id               text COLLATE "C" NOT NULL,
    domain           text             NOT NULL,
    descriptor       jsonb            NOT NULL,
    descriptor_hash  text             NOT NULL,
    limit_name       text COLLATE "C" NOT NULL,
    created_at       timestamptz      NOT NULL,
    updated_at       timestamptz      NOT NULL,
    updated_by       text             NOT NULL,
    CONSTRAINT rules_pkey PRIMARY KEY (id),
    CONSTRAINT rules_limit_fkey FOREIGN KEY (limit_name) REFERENCES limits (name) ON DELETE RESTRICT,
    CONSTRAINT rules_domain_descriptor_key UNIQUE (domain, descriptor_hash)
);

-- The rules of one limit, which keep it from being deleted.
CREATE INDEX rules_limit_idx ON rules (limit_name);

COMMENT ON TABLE rules IS 'Map the descriptors of an Envoy rate limit domain onto a limit.';
COMMENT ON COLUMN rules.descriptor IS 'The pattern: [{"key","value"}] in order; a value ending in * is a prefix, an absent value matches any.';
COMMENT ON COLUMN rules.descriptor_hash IS 'SHA-256 of the descriptor as stored, hex: one domain holds a pattern once, and a descriptor may be too long for an index entry.';
COMMENT ON COLUMN rules.updated_by IS 'Name of the API token that made the last change.';

ALTER TABLE audit DROP CONSTRAINT audit_entity_check,
    ADD CONSTRAINT audit_entity_check CHECK (entity IN ('limit', 'override', 'token', 'rule'));

-- +goose Down
DELETE FROM audit WHERE entity = 'rule';
ALTER TABLE audit DROP CONSTRAINT audit_entity_check,
    ADD CONSTRAINT audit_entity_check CHECK (entity IN ('limit', 'override', 'token'));
DROP TABLE rules;
