-- +goose Up
CREATE TABLE audit (
    -- AUTOINCREMENT: a sequence number is never reused, even after the
    -- newest entries are deleted, because replicas follow it as a watermark.
    seq         INTEGER   PRIMARY KEY AUTOINCREMENT,
    at          TIMESTAMP NOT NULL,
    actor       TEXT      NOT NULL,
    entity      TEXT      NOT NULL,
    entity_id   TEXT      NOT NULL,
    action      TEXT      NOT NULL,
    limit_name  TEXT,
    bucket_id   TEXT,
    -- JSON of the row before and after the change; never a token hash
    before      TEXT,
    after       TEXT,
    CONSTRAINT audit_entity_check CHECK (entity IN ('limit', 'override', 'token')),
    CONSTRAINT audit_action_check CHECK (action IN ('create', 'update', 'delete')),
    CONSTRAINT audit_override_bucket_check CHECK (entity <> 'override' OR (limit_name IS NOT NULL AND bucket_id IS NOT NULL))
);

CREATE INDEX audit_entity_idx ON audit (entity, entity_id, seq);

-- +goose Down
DROP TABLE audit;
