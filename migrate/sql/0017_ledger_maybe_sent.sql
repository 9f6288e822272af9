-- An effect remembers whether any attempt may have taken effect: an answer
-- that proves nothing (a 5xx, a cut response, a timeout, a lease that ended
-- while in flight) or a target that said the request was still in progress.
-- Retries that run out then leave the effect unknown, never failed_terminal:
-- a later "not sent" cannot undo what an earlier attempt may have done.
-- A constant default rewrites nothing (PostgreSQL 11+).
ALTER TABLE {{.Table "ledger"}} ADD COLUMN maybe_sent boolean NOT NULL DEFAULT false;
