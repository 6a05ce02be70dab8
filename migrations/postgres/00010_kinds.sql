-- +goose Up
-- Limits of two more sorts than GCRA rates: concurrency limits, whose
-- buckets hold leases, and calendar quotas, which count units in the
-- calendar windows of a time zone. Every existing limit is a rate limit.
ALTER TABLE limits
    ADD COLUMN kind text NOT NULL DEFAULT 'rate',
    ADD COLUMN calendar text NOT NULL DEFAULT '',
    ADD COLUMN time_zone text NOT NULL DEFAULT '',
    ADD CONSTRAINT limits_kind_check CHECK (kind IN ('rate', 'concurrency')),
    ADD CONSTRAINT limits_calendar_check CHECK (calendar IN ('', 'hour', 'day', 'week', 'month', 'year')),
    ADD CONSTRAINT limits_quota_kind_check CHECK (calendar = '' OR kind = 'rate'),
    ADD CONSTRAINT limits_time_zone_check CHECK ((calendar = '') = (time_zone = '')),
    ADD CONSTRAINT limits_params_check CHECK ((kind = 'rate' AND calendar = '') OR burst = count),
    DROP CONSTRAINT limits_period_check,
    ADD CONSTRAINT limits_period_check CHECK (CASE WHEN calendar = '' THEN period > 0 ELSE period = 0 END);

COMMENT ON COLUMN limits.kind IS 'rate (GCRA; also every calendar quota) or concurrency (leases: burst is the most units a bucket holds at once). Fixed at creation: the stored bucket states of one kind mean nothing to the other.';
COMMENT ON COLUMN limits.calendar IS 'hour, day, week, month or year for a calendar quota of count units per window; empty for any other limit. A rate limit never becomes a quota, nor a quota a rate limit.';
COMMENT ON COLUMN limits.time_zone IS 'IANA name of the zone whose boundaries start a quota''s windows; empty exactly when calendar is. A change of calendar or zone gives the limit the next generation, so that its usage restarts in the new windows.';
COMMENT ON COLUMN limits.period IS 'Period of count, in nanoseconds (a Go time.Duration); for a concurrency limit the longest a lease lives without renewal; 0 for a calendar quota, whose window is the calendar''s.';
COMMENT ON COLUMN limits.generation IS 'enums.generation when the limit was created, or when its calendar or time zone last changed; bucket keys are <enum>:<bucket_id> for generation 1 and <enum>.<generation>:<bucket_id> after.';

-- An override of a quota has no period, and one that blocks a quota's
-- bucket a count of 0 (its burst equals its count); which limit an
-- override's parameters suit is the service's to check.
ALTER TABLE overrides
    DROP CONSTRAINT overrides_count_check,
    ADD CONSTRAINT overrides_count_check CHECK (count >= 0),
    DROP CONSTRAINT overrides_period_check,
    ADD CONSTRAINT overrides_period_check CHECK (period >= 0);

COMMENT ON COLUMN overrides.count IS 'NULL when unlimited; 0 only for a blocked calendar quota.';
COMMENT ON COLUMN overrides.period IS 'Period of count, in nanoseconds (a Go time.Duration); 0 for a calendar quota; NULL when unlimited.';

-- +goose Down
-- The older schema holds rate limits only. The limits it cannot hold go,
-- with their overrides and rules; their audit entries stay as history.
DELETE FROM overrides WHERE limit_name IN (SELECT name FROM limits WHERE kind <> 'rate' OR calendar <> '');
DELETE FROM rules WHERE limit_name IN (SELECT name FROM limits WHERE kind <> 'rate' OR calendar <> '');
DELETE FROM limits WHERE kind <> 'rate' OR calendar <> '';

ALTER TABLE overrides
    DROP CONSTRAINT overrides_count_check,
    ADD CONSTRAINT overrides_count_check CHECK (count >= 1),
    DROP CONSTRAINT overrides_period_check,
    ADD CONSTRAINT overrides_period_check CHECK (period > 0);
COMMENT ON COLUMN overrides.count IS 'NULL when unlimited.';
COMMENT ON COLUMN overrides.period IS 'Period of count, in nanoseconds (a Go time.Duration); NULL when unlimited.';

ALTER TABLE limits
    DROP CONSTRAINT limits_period_check,
    DROP CONSTRAINT limits_params_check,
    DROP CONSTRAINT limits_time_zone_check,
    DROP CONSTRAINT limits_quota_kind_check,
    DROP CONSTRAINT limits_calendar_check,
    DROP CONSTRAINT limits_kind_check,
    DROP COLUMN time_zone,
    DROP COLUMN calendar,
    DROP COLUMN kind,
    ADD CONSTRAINT limits_period_check CHECK (period > 0);
COMMENT ON COLUMN limits.period IS 'Period of count, in nanoseconds (a Go time.Duration).';
COMMENT ON COLUMN limits.generation IS 'enums.generation when the limit was created; bucket keys are <enum>:<bucket_id> for generation 1 and <enum>.<generation>:<bucket_id> after.';
