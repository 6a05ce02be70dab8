-- +goose Up
CREATE TABLE rules (
    id               TEXT      NOT NULL,
    domain           TEXT      NOT NULL,
    -- [{"key","value"}] in order, as JSON
    descriptor       TEXT      NOT NULL,
    -- SHA-256 of descriptor, hex
    descriptor_hash  TEXT      NOT NULL,
    limit_name       TEXT      NOT NULL,
    created_at       TIMESTAMP NOT NULL,
    updated_at       TIMESTAMP NOT NULL,
    updated_by       TEXT      NOT NULL,
    CONSTRAINT rules_pkey PRIMARY KEY (id),
    CONSTRAINT rules_limit_fkey FOREIGN KEY (limit_name) REFERENCES limits (name) ON DELETE RESTRICT,
    CONSTRAINT rules_domain_descriptor_key UNIQUE (domain, descriptor_hash)
);

CREATE INDEX rules_limit_idx ON rules (limit_name);

-- SQLite cannot change a CHECK constraint: the audit table is rebuilt with
-- 'rule' among its entities, keeping every entry and its sequence number.
CREATE TABLE audit_new (
    seq         INTEGER   PRIMARY KEY AUTOINCREMENT,
    at          TIMESTAMP NOT NULL,
    actor       TEXT      NOT NULL,
    entity      TEXT      NOT NULL,
    entity_id   TEXT      NOT NULL,
    action      TEXT      NOT NULL,
    limit_name  TEXT,
    bucket_id   TEXT,
    before      TEXT,
    after       TEXT,
    CONSTRAINT audit_entity_check CHECK (entity IN ('limit', 'override', 'token', 'rule')),
    CONSTRAINT audit_action_check CHECK (action IN ('create', 'update', 'delete')),
    CONSTRAINT audit_override_bucket_check CHECK (entity <> 'override' OR (limit_name IS NOT NULL AND bucket_id IS NOT NULL))
);
INSERT INTO audit_new (seq, at, actor, entity, entity_id, action, limit_name, bucket_id, before, after)
    SELECT seq, at, actor, entity, entity_id, action, limit_name, bucket_id, before, after FROM audit;
DROP TABLE audit;
ALTER TABLE audit_new RENAME TO audit;
CREATE INDEX audit_entity_idx ON audit (entity, entity_id, seq);

-- +goose Down
DELETE FROM audit WHERE entity = 'rule';
DROP TABLE rules;
