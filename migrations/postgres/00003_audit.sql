-- +goose Up
CREATE TABLE audit (
    seq         bigserial        NOT NULL,
    at          timestamptz      NOT NULL,
    actor       text             NOT NULL,
    entity      text             NOT NULL,
    entity_id   text COLLATE "C" NOT NULL,
    action      text             NOT NULL,
    limit_name  text COLLATE "C",
    bucket_id   text,
    before      jsonb,
    after       jsonb,
    CONSTRAINT audit_pkey PRIMARY KEY (seq),
    CONSTRAINT audit_entity_check CHECK (entity IN ('limit', 'override', 'token')),
    CONSTRAINT audit_action_check CHECK (action IN ('create', 'update', 'delete')),
    CONSTRAINT audit_override_bucket_check CHECK (entity <> 'override' OR (limit_name IS NOT NULL AND bucket_id IS NOT NULL))
);

-- History of one entity, in order.
CREATE INDEX audit_entity_idx ON audit (entity, entity_id, seq);

COMMENT ON TABLE audit IS 'One entry per change of a limit, override or token, written in the transaction of the change: the history shown to people and the change log replicas follow.';
COMMENT ON COLUMN audit.seq IS 'Change sequence number. Writers serialise on an advisory lock, so entries commit in seq order and a replica that has read up to seq N has seen every change up to N; a snapshot''s version is the highest seq it includes.';
COMMENT ON COLUMN audit.actor IS 'Name of the API token that made the change.';
COMMENT ON COLUMN audit.entity_id IS 'Limit name, override id or token id.';
COMMENT ON COLUMN audit.limit_name IS 'Limit of an override (or the limit itself), kept so that a deleted override''s bucket is known.';
COMMENT ON COLUMN audit.bucket_id IS 'Canonical bucket id of an override, kept so that a deleted override''s bucket is known.';
COMMENT ON COLUMN audit.before IS 'The row before the change as JSON, NULL for a creation; never a token hash.';
COMMENT ON COLUMN audit.after IS 'The row after the change as JSON, NULL for a deletion; never a token hash.';

-- +goose Down
DROP TABLE audit;
