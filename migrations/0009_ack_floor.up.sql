-- ack_floor is a recipient's acked_seq as it was before the last ack moved
-- it (both move in one UPDATE). Every signal at or below it is already
-- marked acknowledged, so an ack marks only seq > ack_floor AND
-- seq <= acked_seq: it walks the range it acknowledges, not the recipient's
-- whole history, whose acknowledged signals stay in the partial index
-- signals_unacked_idx as dead entries until a VACUUM.
--
-- 0 (the default, no table rewrite) is always a correct floor: the first ack
-- of a session after this migration walks from the start once.
ALTER TABLE sessions ADD COLUMN ack_floor bigint NOT NULL DEFAULT 0;
