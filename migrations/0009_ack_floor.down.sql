ALTER TABLE sessions DROP COLUMN ack_floor;
