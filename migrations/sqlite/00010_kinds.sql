-- +goose Up
-- Limits of two more sorts than GCRA rates: concurrency limits and
-- calendar quotas (see the Postgres set for what each column means).
-- Every existing limit is a rate limit.
--
-- SQLite cannot change a CHECK constraint, and a quota has period 0 (its
-- overrides too, and a count of 0 when they block): limits and overrides
-- are rebuilt with their new checks, keeping every row. rules is rebuilt
-- as well, because a table cannot be dropped while rows of another refer
-- to it; the new tables refer to limits_new, which the rename at the end
-- turns into references to limits.
CREATE TABLE limits_new (
    name        TEXT      NOT NULL,
    enum        INTEGER   NOT NULL,
    generation  INTEGER   NOT NULL DEFAULT 1,
    id_format   TEXT      NOT NULL,
    kind        TEXT      NOT NULL DEFAULT 'rate',
    -- hour, day, week, month or year for a calendar quota; '' otherwise
    calendar    TEXT      NOT NULL DEFAULT '',
    -- an IANA zone name, '' exactly when calendar is
    time_zone   TEXT      NOT NULL DEFAULT '',
    burst       INTEGER   NOT NULL,
    count       INTEGER   NOT NULL,
    -- nanoseconds; 0 for a calendar quota
    period      INTEGER   NOT NULL,
    description TEXT      NOT NULL DEFAULT '',
    unit        TEXT      NOT NULL DEFAULT 'requests',
    shadow      BOOLEAN   NOT NULL DEFAULT FALSE,
    created_at  TIMESTAMP NOT NULL,
    updated_at  TIMESTAMP NOT NULL,
    CONSTRAINT limits_pkey PRIMARY KEY (name),
    CONSTRAINT limits_enum_key UNIQUE (enum),
    CONSTRAINT limits_enum_check CHECK (enum >= 1),
    CONSTRAINT limits_generation_check CHECK (generation >= 1),
    CONSTRAINT limits_burst_check CHECK (burst >= 1),
    CONSTRAINT limits_count_check CHECK (count >= 1),
    CONSTRAINT limits_shadow_check CHECK (shadow IN (0, 1)),
    CONSTRAINT limits_unit_check CHECK (length(unit) BETWEEN 1 AND 32),
    CONSTRAINT limits_kind_check CHECK (kind IN ('rate', 'concurrency')),
    CONSTRAINT limits_calendar_check CHECK (calendar IN ('', 'hour', 'day', 'week', 'month', 'year')),
    CONSTRAINT limits_quota_kind_check CHECK (calendar = '' OR kind = 'rate'),
    CONSTRAINT limits_time_zone_check CHECK ((calendar = '') = (time_zone = '')),
    CONSTRAINT limits_params_check CHECK ((kind = 'rate' AND calendar = '') OR burst = count),
    CONSTRAINT limits_period_check CHECK (CASE WHEN calendar = '' THEN period > 0 ELSE period = 0 END)
);
INSERT INTO limits_new (name, enum, generation, id_format, burst, count, period, description, unit, shadow, created_at, updated_at)
    SELECT name, enum, generation, id_format, burst, count, period, description, unit, shadow, created_at, updated_at FROM limits;

CREATE TABLE overrides_new (
    id          TEXT      NOT NULL,
    limit_name  TEXT      NOT NULL,
    -- canonical under the limit's id_format
    bucket_id   TEXT      NOT NULL,
    -- burst, count and period are NULL when unlimited; period in
    -- nanoseconds, 0 for a calendar quota, whose blocked buckets have
    -- count 0
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
    CONSTRAINT overrides_limit_fkey FOREIGN KEY (limit_name) REFERENCES limits_new (name) ON DELETE RESTRICT,
    CONSTRAINT overrides_limit_bucket_key UNIQUE (limit_name, bucket_id),
    CONSTRAINT overrides_burst_check CHECK (burst >= 0),
    CONSTRAINT overrides_count_check CHECK (count >= 0),
    CONSTRAINT overrides_period_check CHECK (period >= 0),
    CONSTRAINT overrides_params_check CHECK (unlimited OR (burst IS NOT NULL AND count IS NOT NULL AND period IS NOT NULL)),
    CONSTRAINT overrides_version_check CHECK (version >= 1),
    CONSTRAINT overrides_unlimited_check CHECK (unlimited IN (0, 1)),
    CONSTRAINT overrides_enabled_check CHECK (enabled IN (0, 1))
);
INSERT INTO overrides_new (id, limit_name, bucket_id, burst, count, period, unlimited, comment, enabled, expires_at, created_at, updated_at, updated_by, version)
    SELECT id, limit_name, bucket_id, burst, count, period, unlimited, comment, enabled, expires_at, created_at, updated_at, updated_by, version FROM overrides;

CREATE TABLE rules_new (
    id               TEXT      NOT NULL,
    domain           TEXT      NOT NULL,
    -- [{"key","value"}] in order, as JSON
    descriptor       TEXT      NOT NULL,
    -- SHA-256 of descriptor, hex
    descriptor_hash  TEXT      NOT NULL,
    limit_name       TEXT      NOT NULL,
    -- a JSON array of limit names
    replaces         TEXT      NOT NULL DEFAULT '[]',
    quota_mode       BOOLEAN   NOT NULL DEFAULT FALSE,
    created_at       TIMESTAMP NOT NULL,
    updated_at       TIMESTAMP NOT NULL,
    updated_by       TEXT      NOT NULL,
    CONSTRAINT rules_pkey PRIMARY KEY (id),
    CONSTRAINT rules_limit_fkey FOREIGN KEY (limit_name) REFERENCES limits_new (name) ON DELETE RESTRICT,
    CONSTRAINT rules_domain_descriptor_key UNIQUE (domain, descriptor_hash),
    CONSTRAINT rules_quota_mode_check CHECK (quota_mode IN (0, 1))
);
INSERT INTO rules_new (id, domain, descriptor, descriptor_hash, limit_name, replaces, quota_mode, created_at, updated_at, updated_by)
    SELECT id, domain, descriptor, descriptor_hash, limit_name, replaces, quota_mode, created_at, updated_at, updated_by FROM rules;

DROP TABLE overrides;
DROP TABLE rules;
DROP TABLE limits;
ALTER TABLE limits_new RENAME TO limits;
ALTER TABLE overrides_new RENAME TO overrides;
ALTER TABLE rules_new RENAME TO rules;
CREATE INDEX overrides_limit_id_idx ON overrides (limit_name, id);
CREATE INDEX rules_limit_idx ON rules (limit_name);

-- +goose Down
-- The older schema holds rate limits only. The limits it cannot hold go,
-- with their overrides and rules; their audit entries stay as history.
-- The tables are rebuilt with the older checks as above.
DELETE FROM overrides WHERE limit_name IN (SELECT name FROM limits WHERE kind <> 'rate' OR calendar <> '');
DELETE FROM rules WHERE limit_name IN (SELECT name FROM limits WHERE kind <> 'rate' OR calendar <> '');
DELETE FROM limits WHERE kind <> 'rate' OR calendar <> '';

CREATE TABLE limits_old (
    name        TEXT      NOT NULL,
    enum        INTEGER   NOT NULL,
    generation  INTEGER   NOT NULL DEFAULT 1,
    id_format   TEXT      NOT NULL,
    burst       INTEGER   NOT NULL,
    count       INTEGER   NOT NULL,
    period      INTEGER   NOT NULL,
    description TEXT      NOT NULL DEFAULT '',
    unit        TEXT      NOT NULL DEFAULT 'requests',
    shadow      BOOLEAN   NOT NULL DEFAULT FALSE,
    created_at  TIMESTAMP NOT NULL,
    updated_at  TIMESTAMP NOT NULL,
    CONSTRAINT limits_pkey PRIMARY KEY (name),
    CONSTRAINT limits_enum_key UNIQUE (enum),
    CONSTRAINT limits_enum_check CHECK (enum >= 1),
    CONSTRAINT limits_generation_check CHECK (generation >= 1),
    CONSTRAINT limits_burst_check CHECK (burst >= 1),
    CONSTRAINT limits_count_check CHECK (count >= 1),
    CONSTRAINT limits_period_check CHECK (period > 0),
    CONSTRAINT limits_shadow_check CHECK (shadow IN (0, 1)),
    CONSTRAINT limits_unit_check CHECK (length(unit) BETWEEN 1 AND 32)
);
INSERT INTO limits_old (name, enum, generation, id_format, burst, count, period, description, unit, shadow, created_at, updated_at)
    SELECT name, enum, generation, id_format, burst, count, period, description, unit, shadow, created_at, updated_at FROM limits;

CREATE TABLE overrides_old (
    id          TEXT      NOT NULL,
    limit_name  TEXT      NOT NULL,
    bucket_id   TEXT      NOT NULL,
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
    CONSTRAINT overrides_limit_fkey FOREIGN KEY (limit_name) REFERENCES limits_old (name) ON DELETE RESTRICT,
    CONSTRAINT overrides_limit_bucket_key UNIQUE (limit_name, bucket_id),
    CONSTRAINT overrides_burst_check CHECK (burst >= 0),
    CONSTRAINT overrides_count_check CHECK (count >= 1),
    CONSTRAINT overrides_period_check CHECK (period > 0),
    CONSTRAINT overrides_params_check CHECK (unlimited OR (burst IS NOT NULL AND count IS NOT NULL AND period IS NOT NULL)),
    CONSTRAINT overrides_version_check CHECK (version >= 1),
    CONSTRAINT overrides_unlimited_check CHECK (unlimited IN (0, 1)),
    CONSTRAINT overrides_enabled_check CHECK (enabled IN (0, 1))
);
INSERT INTO overrides_old (id, limit_name, bucket_id, burst, count, period, unlimited, comment, enabled, expires_at, created_at, updated_at, updated_by, version)
    SELECT id, limit_name, bucket_id, burst, count, period, unlimited, comment, enabled, expires_at, created_at, updated_at, updated_by, version FROM overrides;

CREATE TABLE rules_old (
    id               TEXT      NOT NULL,
    domain           TEXT      NOT NULL,
    descriptor       TEXT      NOT NULL,
    descriptor_hash  TEXT      NOT NULL,
    limit_name       TEXT      NOT NULL,
    replaces         TEXT      NOT NULL DEFAULT '[]',
    quota_mode       BOOLEAN   NOT NULL DEFAULT FALSE,
    created_at       TIMESTAMP NOT NULL,
    updated_at       TIMESTAMP NOT NULL,
    updated_by       TEXT      NOT NULL,
    CONSTRAINT rules_pkey PRIMARY KEY (id),
    CONSTRAINT rules_limit_fkey FOREIGN KEY (limit_name) REFERENCES limits_old (name) ON DELETE RESTRICT,
    CONSTRAINT rules_domain_descriptor_key UNIQUE (domain, descriptor_hash),
    CONSTRAINT rules_quota_mode_check CHECK (quota_mode IN (0, 1))
);
INSERT INTO rules_old (id, domain, descriptor, descriptor_hash, limit_name, replaces, quota_mode, created_at, updated_at, updated_by)
    SELECT id, domain, descriptor, descriptor_hash, limit_name, replaces, quota_mode, created_at, updated_at, updated_by FROM rules;

DROP TABLE overrides;
DROP TABLE rules;
DROP TABLE limits;
ALTER TABLE limits_old RENAME TO limits;
ALTER TABLE overrides_old RENAME TO overrides;
ALTER TABLE rules_old RENAME TO rules;
CREATE INDEX overrides_limit_id_idx ON overrides (limit_name, id);
CREATE INDEX rules_limit_idx ON rules (limit_name);
