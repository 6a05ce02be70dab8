-- +goose Up
CREATE TABLE overrides (
    -- Time-ordered ids (26 characters of Crockford base32); byte order is
    -- creation order, which listings and their page tokens rely on.
    id          text COLLATE "C" NOT NULL,
    limit_name  text COLLATE "C" NOT NULL,
    bucket_id   text             NOT NULL,
    burst       bigint,
    count       bigint,
    period      bigint,
    unlimited   boolean          NOT NULL DEFAULT false,
    comment     text             NOT NULL DEFAULT '',
    enabled     boolean          NOT NULL DEFAULT true,
    expires_at  timestamptz,
    created_at  timestamptz      NOT NULL,
    updated_at  timestamptz      NOT NULL,
    updated_by  text             NOT NULL,
    version     bigint           NOT NULL DEFAULT 1,
    CONSTRAINT overrides_pkey PRIMARY KEY (id),
    CONSTRAINT overrides_limit_fkey FOREIGN KEY (limit_name) REFERENCES limits (name) ON DELETE RESTRICT,
    CONSTRAINT overrides_limit_bucket_key UNIQUE (limit_name, bucket_id),
    CONSTRAINT overrides_burst_check CHECK (burst >= 0),
    CONSTRAINT overrides_count_check CHECK (count >= 1),
    CONSTRAINT overrides_period_check CHECK (period > 0),
    CONSTRAINT overrides_params_check CHECK (unlimited OR (burst IS NOT NULL AND count IS NOT NULL AND period IS NOT NULL)),
    CONSTRAINT overrides_version_check CHECK (version >= 1)
);

-- Listings of one limit's overrides, newest first.
CREATE INDEX overrides_limit_id_idx ON overrides (limit_name, id);

COMMENT ON TABLE overrides IS 'Parameters that replace a limit''s defaults for one bucket.';
COMMENT ON COLUMN overrides.bucket_id IS 'Canonical form of the bucket id under the limit''s id_format, so that one bucket has one override whatever notation it was written in.';
COMMENT ON COLUMN overrides.burst IS '0 blocks the bucket; NULL when unlimited.';
COMMENT ON COLUMN overrides.count IS 'NULL when unlimited.';
COMMENT ON COLUMN overrides.period IS 'Period of count, in nanoseconds (a Go time.Duration); NULL when unlimited.';
COMMENT ON COLUMN overrides.unlimited IS 'Exempts the bucket: always allowed, no store call.';
COMMENT ON COLUMN overrides.enabled IS 'false keeps the override on record without applying it.';
COMMENT ON COLUMN overrides.expires_at IS 'When the override stops applying; NULL means never.';
COMMENT ON COLUMN overrides.updated_by IS 'Name of the API token that made the last change.';
COMMENT ON COLUMN overrides.version IS 'Counts the changes of the override, from 1; it is the ETag that If-Match compares.';

-- +goose Down
DROP TABLE overrides;
