-- ledger.List by consumer and status at once (`idem ledger list --consumer
-- c --status s`): an index in the listing's order, so that a page reads
-- the rows it prints, not every row of the status for other consumers.
CREATE INDEX {{.Name "ledger_consumer_status_created_idx"}} ON {{.Table "ledger"}} (consumer, status, created_at, effect_id);
