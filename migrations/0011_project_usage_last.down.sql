DROP FUNCTION marconi_settle_usage;
