-- The instances forget which bus key they seal with; the key itself stays.
ALTER TABLE instances DROP COLUMN bus_key_version;
