// Package stream runs a consumer over a RabbitMQ stream instead of a queue:
// in order, batched, with the stream offset checkpointed in each batch's
// transaction, and one active reader per (consumer name, stream) across
// processes — the others wait as hot standbys and take over when it stops.
//
// It is a package of its own so that a worker that only consumes queues
// does not link the stream client.
//
// # A stream consumer
//
// The consumer is an ordinary consumer.Consumer built without a Queue; its
// handler is an ordinary handler. New makes it read a stream, and Run reads
// until its context is cancelled:
//
//	c, err := consumer.New(consumer.Config{
//		Name:    "orders-projection",
//		Pool:    pool,
//		Tables:  tables,
//		AMQPURL: amqpURL(),
//		Logger:  slog.New(slog.DiscardHandler),
//	})
//	if err != nil {
//		log.Fatal(err)
//	}
//	c.Handle(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
//		return consumer.Defer(ctx, tx, `INSERT INTO `+tables.QuotedSchema()+`.events (stream_offset, body) VALUES ($1, $2)`,
//			m.Offset, string(m.Body))
//	})
//	s, err := stream.New(c, stream.Config{Stream: name})
//	if err != nil {
//		log.Fatal(err)
//	}
//
// and then:
//
//	go func() { ran <- stream.Run(runCtx, s) }()
//
// New refuses a consumer whose Config sets a field only a queue reads
// (consumer.Config.QueueOnly: Queue, OrderingKey, Prefetch…): a wrong
// combination fails there, never in Run. The stream must exist: declare it
// as a stream queue (x-queue-type "stream") when you set up the broker. The
// stream protocol's URL is Config.URL, else IDEM_STREAM_URL, else derived
// from the consumer's AMQPURL (same credentials, host and vhost, port 5552).
//
// # Order and checkpoints
//
// Messages arrive in offset order, in batches of what is already buffered.
// Each batch's transaction also writes the consumer's checkpoint (the last
// offset it settled), so a restart resumes exactly after the last committed
// message. The inbox still deduplicates by message id: a producer that
// published an event twice sees the copy acked as a duplicate.
//
// A message whose handler fails is retried in place (a stream has no retry
// queue), after a backoff of consumer.Config.RetryBaseDelay doubling to
// RetryMaxDelay, with the messages after it waiting, until it succeeds or is
// dead-lettered with reason max_attempts (a row in the dead-letter table;
// a stream has no dead-letter queue either). The checkpoint never passes a
// message that is not settled.
//
// # Hot standby
//
// Run the same worker in several processes. Each Run waits for a PostgreSQL
// advisory lock of (Name, Stream); the holder reads, the others stand by
// and report ready, and one of them takes over within about a second when
// the holder's database session ends. The lock saves work; the inbox and
// the checkpoint in each transaction are what make an overlap harmless.
//
// # Rebuilds beside the reader
//
// A rebuild (package replay) may replace the projection's tables while the
// reader runs: each batch transaction begins by taking the consumer's swap
// gate, a PostgreSQL advisory lock, in shared mode, so the swap waits for
// the batch in flight and the next batch waits for the swap, then writes to
// the rebuilt tables, from the same checkpoint.
//
// # Replays
//
// A stream keeps its history, so it can be read again: package replay runs
// the same consumer's handler over a bounded range of it, to rebuild a
// projection, to investigate without writing, or to repair selected
// messages. The guide docs/streams.md walks through both.
package stream
