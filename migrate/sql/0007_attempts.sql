-- What the runtime knows about a message's past attempts, kept in the
-- database rather than in message headers, which a publisher controls.
--   failures: handler attempts that failed and were sent to the retry queue;
--             a delivery back from the retry queue is attempt failures + 1.
--   crashes:  times the message was being run alone when its worker died
--             (a start is counted before the handler runs and cleared when
--             its transaction commits); a poison message is dead-lettered
--             by idem before the broker's delivery limit.
--   exchange, routing_key: the route the message was first published with,
--             restored when it comes back from the retry queue.
-- A row is deleted in the transaction that settles its message for good.
CREATE TABLE {{.Table "attempts"}} (
	consumer    text        COLLATE "C" NOT NULL,
	message_id  text        COLLATE "C" NOT NULL,
	failures    integer     NOT NULL DEFAULT 0,
	crashes     integer     NOT NULL DEFAULT 0,
	exchange    text        NOT NULL DEFAULT '',
	routing_key text        NOT NULL DEFAULT '',
	updated_at  timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer, message_id)
);

CREATE INDEX {{.Name "attempts_updated_idx"}} ON {{.Table "attempts"}} (updated_at);
