// Package deadletters is the operator's side of dead letters: find them, and
// move them back to their queue once their cause is fixed.
//
// # Where dead letters are
//
// A consumer that cannot process a message (a payload conflict, a handler
// that returned consumer.DeadLetter, too many attempts) commits a row in the
// dead-letter table, in the same transaction as the rest of its batch, and
// then publishes the message to its dead-letter queue (by default the queue's
// name + ".dlq") with headers that say why: x-idem-reason, x-idem-error,
// x-idem-consumer, x-idem-attempts, x-idem-payload-hash. The row answers
// "what happened to message X" from SQL; List reads it:
//
//	recs, err := deadletters.List(ctx, pool, tables, deadletters.Filter{Reason: "max_attempts"})
//
// # Redrive
//
// Redrive moves the messages of the dead-letter queue that match its
// filters (reason, consumer, message id, a limit) back to the queue:
//
//	res, err := deadletters.Redrive(ctx, deadletters.RedriveOptions{
//		AMQPURL:  amqpURL(),
//		Pool:     pool,
//		Tables:   tables,
//		Queue:    queue,
//		Reason:   "max_attempts",
//		Operator: "alice",
//	})
//
// or from the command line:
//
//	idem deadletters redrive --queue payments.capture.requested --reason max_attempts
//
// The copy keeps the body, the properties, the message id and the
// publisher's headers; idem's reason and attempt headers (and the broker's
// x-death) move into HistoryHeader, an array of tables with one entry per
// redrive, so the consumer starts the message afresh at attempt 1 and an
// operator can still read its past. The original route
// (x-idem-original-exchange and -routing-key) stays on the message.
//
// # Never lost, kept in order
//
// Redrive takes the messages from the head of the dead-letter queue, at
// most as many as it held when Redrive started. It publishes a copy of
// each, with publisher confirms and the mandatory flag: a matching message
// to the queue, any other back to the dead-letter queue's tail as it is.
// It marks the dead-letter rows of the moved ones (redriven_at,
// redriven_by), and only then acks the messages it took. A refused publish,
// a failure or a crash at any point leaves the message in the dead-letter
// queue (at worst with a copy already in the queue or at the tail, which
// the consumer's inbox recognises as a duplicate).
//
// Once Redrive went through, the messages it kept are in their order, and
// none was handed back to the queue, so none counts one more delivery (a
// quorum queue's x-delivery-count). A message dead-lettered while Redrive
// runs is not looked at; it stays behind the kept messages taken before it
// arrived and ahead of those taken after. A Redrive that fails midway
// leaves the messages it put back so far behind those it had not reached.
//
// Only a Redrive that fails or is cancelled hands messages back: the few it
// held at that moment, which a quorum queue counts as delivered once more.
// On RabbitMQ 4 a quorum queue drops a message past its delivery limit (20
// by default) when it has no dead-letter target of its own: give
// dead-letter queues no delivery limit (a policy with delivery-limit -1).
package deadletters
