-- The trace context of the span that recorded an effect (W3C traceparent
-- and tracestate as a JSON object), so that the dispatcher's call, hours or
-- retries later, continues the trace of the request or message that caused
-- it. NULL when the effect was recorded outside any trace. Adding a nullable
-- column without a default rewrites nothing.
ALTER TABLE {{.Table "ledger"}} ADD COLUMN trace_context jsonb;
