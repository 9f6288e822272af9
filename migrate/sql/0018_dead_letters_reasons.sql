-- Dead letters grouped by reason, or by consumer and reason
-- (deadletters.Groups, `idem deadletters list --group-by`): a group is
-- found by skipping from one key to the next in its index, its oldest and
-- newest are the ends of its range, and its count reads at most a capped
-- number of its entries, so the cost follows the number of groups, not of
-- dead letters. Only those not redriven wait for an operator.
CREATE INDEX {{.Name "dead_letters_reason_idx"}} ON {{.Table "dead_letters"}} (reason, dead_lettered_at)
	WHERE redriven_at IS NULL;
CREATE INDEX {{.Name "dead_letters_consumer_reason_idx"}} ON {{.Table "dead_letters"}} (consumer, reason, dead_lettered_at)
	WHERE redriven_at IS NULL;
