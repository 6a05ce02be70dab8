-- +goose Up
CREATE TABLE enums (
    enum       integer          NOT NULL,
    name       text COLLATE "C" NOT NULL,
    generation integer          NOT NULL DEFAULT 1,
    CONSTRAINT enums_pkey PRIMARY KEY (enum),
    CONSTRAINT enums_enum_check CHECK (enum >= 1),
    CONSTRAINT enums_generation_check CHECK (generation >= 1)
);

COMMENT ON TABLE enums IS 'Every enum ever given to a limit, deleted limits included: an enum is never given to another limit, so that bucket states in the stores never pass from a deleted limit to a new one.';
COMMENT ON COLUMN enums.name IS 'The limit the enum was last given to.';
COMMENT ON COLUMN enums.generation IS 'How many times the enum was given. Only a catalogue name (enums 1-9) gets its enum again after a deletion; the generation is then part of its bucket keys, so that the new limit starts with full buckets.';

ALTER TABLE limits ADD COLUMN generation integer NOT NULL DEFAULT 1;
ALTER TABLE limits ADD CONSTRAINT limits_generation_check CHECK (generation >= 1);
COMMENT ON COLUMN limits.generation IS 'enums.generation when the limit was created; bucket keys are <enum>:<bucket_id> for generation 1 and <enum>.<generation>:<bucket_id> after.';

-- The enums given so far: those of the limits, then those of deleted
-- limits as their creations were recorded.
INSERT INTO enums (enum, name) SELECT enum, name FROM limits;
INSERT INTO enums (enum, name)
SELECT DISTINCT ON (enum) enum, name FROM (
    SELECT (after->>'enum')::bigint AS enum, entity_id AS name, seq
    FROM audit WHERE entity = 'limit' AND action = 'create'
) created
WHERE enum BETWEEN 1 AND 2147483647
ORDER BY enum, seq DESC
ON CONFLICT (enum) DO NOTHING;

-- +goose Down
ALTER TABLE limits DROP COLUMN generation;
DROP TABLE enums;
