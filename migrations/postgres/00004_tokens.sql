-- +goose Up
CREATE TABLE tokens (
    id          text COLLATE "C" NOT NULL,
    name        text             NOT NULL,
    scope       text             NOT NULL,
    hash        text             NOT NULL,
    created_at  timestamptz      NOT NULL,
    revoked_at  timestamptz,
    CONSTRAINT tokens_pkey PRIMARY KEY (id),
    CONSTRAINT tokens_hash_key UNIQUE (hash),
    CONSTRAINT tokens_scope_check CHECK (scope IN ('admin', 'support', 'decide'))
);

COMMENT ON TABLE tokens IS 'API tokens; a secret is shown once, at creation, and only its hash is kept.';
COMMENT ON COLUMN tokens.name IS 'Recorded as the actor of the changes the token makes.';
COMMENT ON COLUMN tokens.hash IS 'Hex SHA-256 of the secret. A 256-bit random secret needs neither salt nor a slow hash.';
COMMENT ON COLUMN tokens.revoked_at IS 'NULL while the token works.';

-- +goose Down
DROP TABLE tokens;
