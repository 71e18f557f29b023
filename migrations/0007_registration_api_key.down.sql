ALTER TABLE sessions DROP COLUMN registration_api_key_hash;
