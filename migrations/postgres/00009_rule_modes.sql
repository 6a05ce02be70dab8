-- +goose Up
-- envoyproxy/ratelimit's replaces and quota_mode, which an import of its
-- files keeps on the rules they become.
ALTER TABLE rules ADD COLUMN replaces jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN quota_mode boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN rules.replaces IS 'JSON array of limit names: a request descriptor matching this rule drops the request''s other descriptors of those limits, which are answered OK and spend nothing.';
COMMENT ON COLUMN rules.quota_mode IS 'A descriptor of this rule over its limit makes the request OVER_LIMIT only when every quota-mode descriptor of the request is over its limit.';

-- +goose Down
ALTER TABLE rules DROP COLUMN replaces, DROP COLUMN quota_mode;
