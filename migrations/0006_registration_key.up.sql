-- The SHA-256 of the Idempotency-Key of the registration that created a
-- session and made its current token, so that a retry of that registration
-- whose answer was lost gets a new token instead of 403. NULL when the
-- registration had no key, and cleared by a resume. The key itself is a
-- secret and never stored.
ALTER TABLE sessions ADD COLUMN registration_key_hash bytea;
