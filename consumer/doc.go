// Package consumer runs handlers over RabbitMQ messages effectively once:
// each handler runs inside a PostgreSQL transaction that also claims the
// message in idem's inbox, the transaction commits, and only then is the
// message acked. A message delivered again finds its inbox row and is acked
// without running the handler.
//
// # A worker
//
// New takes a Config (Name, which scopes the inbox, and Pool are required;
// Run also needs AMQPURL and Queue, or a Stream), Handle registers the
// handler, and Run consumes until its context is cancelled:
//
//	c, err := consumer.New(consumer.Config{
//		Name:    "billing",
//		Queue:   "deposits",
//		Pool:    pool,
//		AMQPURL: os.Getenv("IDEM_AMQP_URL"),
//	})
//	if err != nil {
//		log.Fatal(err)
//	}
//	type deposit struct {
//		Account string `json:"account"`
//		Amount  int64  `json:"amount"`
//	}
//	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d deposit) error {
//		return consumer.Defer(ctx, tx, `UPDATE balances SET balance = balance + $2 WHERE account = $1`, d.Account, d.Amount)
//	}))
//	if err := c.Run(ctx); err != nil { // until ctx is cancelled
//		log.Fatal(err)
//	}
//
// idem's tables come from package migrate (migrate.Up, or `idem migrate`).
// Run declares the queue (a quorum queue by default), a retry queue and a
// dead-letter queue named after it (Consumer.Queues lists them) unless
// Config.Topology says otherwise, reconnects
// whenever a connection or channel dies, and returns nil after a shutdown
// in which the batches in flight commit and ack. It returns an error only
// for what reconnecting cannot fix: a bad Config, refused credentials, no
// access to the vhost or the queue.
//
// # Handlers
//
// A Handler gets the Message (id, body, headers, attempt, payload hash, …)
// and the batch's open transaction. Its writes commit together with the
// message's inbox row, or not at all. JSON decodes the body into a type of
// your own first. What the handler returns decides what becomes of the
// message:
//
//   - nil: processed; its writes commit, then the message is acked.
//   - DeadLetter(reason, err) or Permanent(err): dead-lettered at once with
//     that reason (Permanent's is "permanent"): a row in the dead-letter
//     table, committed with the batch, and a copy in the dead-letter queue.
//   - any other error, or a panic: retried later, from the retry queue, with
//     exponential backoff (with an OrderingKey or Partitions, in place,
//     its key's later messages waiting behind it); after MaxAttempts it is
//     dead-lettered with reason "max_attempts".
//
// For instance:
//
//	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d deposit) error {
//		if d.Amount <= 0 {
//			return consumer.DeadLetter("invalid_deposit", fmt.Errorf("amount %d", d.Amount))
//		}
//		if d.Account == "frozen" {
//			return errors.New("account frozen for now") // retried later
//		}
//		return consumer.Defer(ctx, tx, increment, d.Account, d.Amount)
//	}))
//
// The runtime owns the transaction: its Commit and Rollback fail, and so do
// statements that would end it (COMMIT, ROLLBACK, SAVEPOINT, …); a handler
// that tries is dead-lettered with reason "handler_ended_transaction". Each
// call's context carries the HandlerTimeout deadline (30s by default); a
// handler past it is cancelled and its message retried, and one that ignores
// its context is abandoned so that the worker goes on.
//
// A handler may run more than once for one delivery (its batch is retried
// after an error elsewhere in it, or after a lost connection); only its
// database writes are guaranteed to commit once. Calls to the outside world
// belong in package ledger, which records them in the transaction and
// carries them out after the commit.
//
// # Batching and Defer
//
// The runtime runs the messages already buffered (up to BatchMaxSize) in one
// transaction: one statement claims every id, the handlers run back to back,
// the transaction commits once. The first handler error reruns the batch
// with a savepoint per message, so a failing message rolls back alone.
//
// Defer is the fastest correct style for a statement whose result the
// handler does not need (an increment, an upsert, an insert): the batch's
// deferred statements are sent together, in order, in one round trip just
// before the commit, instead of one round trip per message:
//
//	c.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d deposit) error {
//		return consumer.Defer(ctx, tx, increment, d.Account, d.Amount)
//	}))
//
// Defer only writes that no later handler of the same batch reads back.
// HandleBatch adds a set-based handler that gets all of a batch's new
// messages at once; it must do what the Handle handler does, which still
// runs message by message when the batch handler fails.
//
// Config.OrderingKey keeps one key's messages in order on one worker;
// Config.BusinessKey, without an OrderingKey, sends one key's messages to
// one worker without promising order. Either way, batches running in
// parallel rarely write the same rows. The guide docs/handlers.md compares
// the handler styles with their measured speed.
//
// # Testing
//
// Process runs messages through the same pipeline as Run without a broker
// and reports each one's Outcome. Package consumertest wraps it for tests:
// a fresh schema per test, a message delivered n times, assertions on what
// became of it.
//
//	out := consumertest.Deliver(t, c, consumertest.Times(3, m)...)
//	consumertest.RequireProcessed(t, out, "m-1")
//	consumertest.RequireDuplicates(t, out, "m-1", 2)
//
// # Streams
//
// A consumer with a Stream instead of a Queue reads a RabbitMQ stream: in
// order, batched, with the stream offset checkpointed in each batch's
// transaction, and one active reader per (Name, Stream) across processes —
// the others wait as hot standbys and take over when it stops. Its handler
// is an ordinary handler, and Run reads until its context is cancelled:
//
//	c, err := consumer.New(consumer.Config{
//		Name:    "orders-projection",
//		Stream:  "orders.events",
//		Pool:    pool,
//		AMQPURL: os.Getenv("IDEM_AMQP_URL"),
//	})
//	if err != nil {
//		log.Fatal(err)
//	}
//	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
//		return consumer.Defer(ctx, tx, `INSERT INTO events (stream_offset, body) VALUES ($1, $2)`, m.Offset, string(m.Body))
//	})
//	if err := c.Run(ctx); err != nil { // until ctx is cancelled
//		log.Fatal(err)
//	}
//
// New refuses a stream consumer whose Config sets a field only a queue
// reads (those whose comment says "queue only": Queue, OrderingKey,
// Prefetch…): a wrong combination fails there, never in Run. The stream
// protocol's URL is StreamURL, else IDEM_STREAM_URL, else derived from
// AMQPURL or AMQPURLs (same credentials, hosts and vhost, port 5552).
//
// With Topology Declare (the default), Run and Declare declare the stream
// through AMQP 0-9-1 (AMQPURL or AMQPURLs), as a publisher over AMQP 0-9-1
// does: durable, x-queue-type "stream", nothing else. A stream that exists
// with other arguments (a retention, say) is read as it is; a queue of
// another type by its name fails Run. With Passive or Existing, a stream
// that does not exist fails Run at once, with an error that names it.
//
// Messages arrive in offset order, in batches of what is already buffered.
// Each batch's transaction also writes the consumer's checkpoint (the last
// offset it settled), so a restart resumes exactly after the last committed
// message. The inbox still deduplicates by message id: a producer that
// published an event twice sees the copy acked as a duplicate.
//
// A message whose handler fails is retried in place (a stream has no retry
// queue), after a backoff of RetryBaseDelay doubling to RetryMaxDelay, with
// the messages after it waiting, until it succeeds or is dead-lettered
// with reason max_attempts (a row in the dead-letter table; a stream has
// no dead-letter queue either). The checkpoint never passes a message that
// is not settled.
//
// Run the same worker in several processes: each Run waits for a
// PostgreSQL advisory lock of (Name, Stream); the holder reads, the others
// stand by and report ready, and one of them takes over within about a
// second when the holder's database session ends. The lock saves work; the
// inbox and the checkpoint in each transaction are what make an overlap
// harmless.
//
// A rebuild (package replay) may replace the projection's tables while the
// reader runs: each batch transaction begins by taking the consumer's swap
// gate, a PostgreSQL advisory lock, in shared mode, so the swap waits for
// the batch in flight and the next batch waits for the swap, then writes to
// the rebuilt tables, from the same checkpoint.
//
// A stream keeps its history, so it can be read again: package replay runs
// the same consumer's handler over a bounded range of it, to rebuild a
// projection, to investigate without writing, or to repair selected
// messages. The guide docs/streams.md walks through both.
//
// # Health and statistics
//
// Stats counts what the consumer did (processed, duplicates, dead letters,
// retries, reconnects, …); the same numbers are OpenTelemetry metrics.
// Health feeds the liveness and readiness probes of package health.
package consumer
