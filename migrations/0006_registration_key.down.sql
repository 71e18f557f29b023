ALTER TABLE sessions DROP COLUMN registration_key_hash;
