-- +goose Up
CREATE TABLE limits (
    -- Names are case-sensitive and listed in byte order, whatever the
    -- database's default collation.
    name        text COLLATE "C" NOT NULL,
    enum        integer          NOT NULL,
    id_format   text             NOT NULL,
    burst       bigint           NOT NULL,
    count       bigint           NOT NULL,
    period      bigint           NOT NULL,
    description text             NOT NULL DEFAULT '',
    shadow      boolean          NOT NULL DEFAULT false,
    created_at  timestamptz      NOT NULL,
    updated_at  timestamptz      NOT NULL,
    CONSTRAINT limits_pkey PRIMARY KEY (name),
    CONSTRAINT limits_enum_key UNIQUE (enum),
    CONSTRAINT limits_enum_check CHECK (enum >= 1),
    CONSTRAINT limits_burst_check CHECK (burst >= 1),
    CONSTRAINT limits_count_check CHECK (count >= 1),
    CONSTRAINT limits_period_check CHECK (period > 0)
);

COMMENT ON TABLE limits IS 'Named rate limits and the default GCRA parameters of their buckets.';
COMMENT ON COLUMN limits.enum IS 'Small integer the name is interned to in bucket keys (<enum>:<bucket_id>). Never changes, so that stored bucket states stay valid. 1-99 are kept for explicit numbers; assigned numbers start at 100.';
COMMENT ON COLUMN limits.id_format IS 'How bucket ids of the limit are validated and canonicalised; cannot change while overrides of the limit exist.';
COMMENT ON COLUMN limits.burst IS 'Most requests a full bucket admits at once.';
COMMENT ON COLUMN limits.count IS 'Requests admitted per period on average.';
COMMENT ON COLUMN limits.period IS 'Period of count, in nanoseconds (a Go time.Duration).';
COMMENT ON COLUMN limits.shadow IS 'Decisions are computed and reported but never deny.';

-- +goose Down
DROP TABLE limits;
