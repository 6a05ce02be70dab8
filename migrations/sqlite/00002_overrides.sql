-- +goose Up
CREATE TABLE overrides (
    id          TEXT      NOT NULL,
    limit_name  TEXT      NOT NULL,
    -- canonical under the limit's id_format
    bucket_id   TEXT      NOT NULL,
    -- burst, count and period are NULL when unlimited; period in nanoseconds
    burst       INTEGER,
    count       INTEGER,
    period      INTEGER,
    unlimited   BOOLEAN   NOT NULL DEFAULT FALSE,
    comment     TEXT      NOT NULL DEFAULT '',
    enabled     BOOLEAN   NOT NULL DEFAULT TRUE,
    expires_at  TIMESTAMP,
    created_at  TIMESTAMP NOT NULL,
    updated_at  TIMESTAMP NOT NULL,
    updated_by  TEXT      NOT NULL,
    version     INTEGER   NOT NULL DEFAULT 1,
    CONSTRAINT overrides_pkey PRIMARY KEY (id),
    CONSTRAINT overrides_limit_fkey FOREIGN KEY (limit_name) REFERENCES limits (name) ON DELETE RESTRICT,
    CONSTRAINT overrides_limit_bucket_key UNIQUE (limit_name, bucket_id),
    CONSTRAINT overrides_burst_check CHECK (burst >= 0),
    CONSTRAINT overrides_count_check CHECK (count >= 1),
    CONSTRAINT overrides_period_check CHECK (period > 0),
    CONSTRAINT overrides_params_check CHECK (unlimited OR (burst IS NOT NULL AND count IS NOT NULL AND period IS NOT NULL)),
    CONSTRAINT overrides_version_check CHECK (version >= 1),
    CONSTRAINT overrides_unlimited_check CHECK (unlimited IN (0, 1)),
    CONSTRAINT overrides_enabled_check CHECK (enabled IN (0, 1))
);

CREATE INDEX overrides_limit_id_idx ON overrides (limit_name, id);

-- +goose Down
DROP TABLE overrides;
