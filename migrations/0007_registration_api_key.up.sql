-- The SHA-256 of the API key that made the registration whose
-- Idempotency-Key registration_key_hash holds: a retry of that registration
-- must come with the same API key, not merely one of the same project.
-- NULL whenever registration_key_hash is; both are cleared by a resume and
-- by the first authenticated use of the token the registration made.
ALTER TABLE sessions ADD COLUMN registration_api_key_hash bytea;
