-- +goose Up
CREATE TABLE enums (
    enum       INTEGER NOT NULL,
    -- the limit the enum was last given to
    name       TEXT    NOT NULL,
    -- how many times the enum was given: only a catalogue name gets its
    -- enum again after a deletion
    generation INTEGER NOT NULL DEFAULT 1,
    CONSTRAINT enums_pkey PRIMARY KEY (enum),
    CONSTRAINT enums_enum_check CHECK (enum >= 1),
    CONSTRAINT enums_generation_check CHECK (generation >= 1)
);

ALTER TABLE limits ADD COLUMN generation INTEGER NOT NULL DEFAULT 1 CONSTRAINT limits_generation_check CHECK (generation >= 1);

INSERT INTO enums (enum, name) SELECT enum, name FROM limits WHERE enum BETWEEN 1 AND 2147483647;
INSERT OR IGNORE INTO enums (enum, name)
SELECT enum, name FROM (
    SELECT json_extract(after, '$.enum') AS enum, entity_id AS name, MAX(seq)
    FROM audit WHERE entity = 'limit' AND action = 'create'
    GROUP BY json_extract(after, '$.enum')
)
WHERE enum BETWEEN 1 AND 2147483647;

-- +goose Down
ALTER TABLE limits DROP COLUMN generation;
DROP TABLE enums;
