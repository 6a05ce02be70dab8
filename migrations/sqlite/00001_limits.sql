-- +goose Up
-- The Postgres set documents every column; this one mirrors it in SQLite's
-- types. Timestamps are declared TIMESTAMP so that the driver reads them
-- back as times; booleans are 0 or 1.
CREATE TABLE limits (
    name        TEXT      NOT NULL,
    enum        INTEGER   NOT NULL,
    id_format   TEXT      NOT NULL,
    burst       INTEGER   NOT NULL,
    count       INTEGER   NOT NULL,
    -- nanoseconds
    period      INTEGER   NOT NULL,
    description TEXT      NOT NULL DEFAULT '',
    shadow      BOOLEAN   NOT NULL DEFAULT FALSE,
    created_at  TIMESTAMP NOT NULL,
    updated_at  TIMESTAMP NOT NULL,
    CONSTRAINT limits_pkey PRIMARY KEY (name),
    CONSTRAINT limits_enum_key UNIQUE (enum),
    CONSTRAINT limits_enum_check CHECK (enum >= 1),
    CONSTRAINT limits_burst_check CHECK (burst >= 1),
    CONSTRAINT limits_count_check CHECK (count >= 1),
    CONSTRAINT limits_period_check CHECK (period > 0),
    CONSTRAINT limits_shadow_check CHECK (shadow IN (0, 1))
);

-- +goose Down
DROP TABLE limits;
