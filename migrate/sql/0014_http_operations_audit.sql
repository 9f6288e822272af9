-- What an operator decided about a long-running operation of the HTTP edge
-- (`idem operations resolve`): an unknown operation, or one whose worker is
-- gone, settled as succeeded or failed. The rows go with their operation
-- when retention deletes it.
CREATE TABLE {{.Table "http_operations_audit"}} (
	id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	operation_id text        COLLATE "C" NOT NULL
	             REFERENCES {{.Table "http_operations"}} (operation_id) ON DELETE CASCADE,
	operator     text        NOT NULL,
	from_state   text        NOT NULL,
	to_state     text        NOT NULL,
	reason       text        NOT NULL,
	at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {{.Name "http_operations_audit_operation_idx"}} ON {{.Table "http_operations_audit"}} (operation_id);

-- The gauges and the operator's lists look for the oldest operation in
-- progress and the oldest unknown one; both are few among many finished
-- operations.
CREATE INDEX {{.Name "http_operations_in_progress_idx"}} ON {{.Table "http_operations"}} (created_at)
	WHERE state IN ('accepted', 'running');
CREATE INDEX {{.Name "http_operations_unknown_idx"}} ON {{.Table "http_operations"}} (updated_at)
	WHERE state = 'unknown';
