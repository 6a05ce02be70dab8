-- +goose Up
CREATE TABLE tokens (
    id          TEXT      NOT NULL,
    name        TEXT      NOT NULL,
    scope       TEXT      NOT NULL,
    -- hex SHA-256 of the secret, which is never stored
    hash        TEXT      NOT NULL,
    created_at  TIMESTAMP NOT NULL,
    revoked_at  TIMESTAMP,
    CONSTRAINT tokens_pkey PRIMARY KEY (id),
    CONSTRAINT tokens_hash_key UNIQUE (hash),
    CONSTRAINT tokens_scope_check CHECK (scope IN ('admin', 'support', 'decide'))
);

-- +goose Down
DROP TABLE tokens;
