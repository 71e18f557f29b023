DROP FUNCTION marconi_settle_usage(text[], text[], text[], bigint[], bigint[]);
