// Package deadletters is the operator's side of dead letters: find them, and
// move them back to their queue once their cause is fixed.
//
// # Where dead letters are
//
// A consumer that cannot process a message (a payload conflict, a handler
// that returned consumer.DeadLetter, too many attempts) commits a row in the
// dead-letter table, in the same transaction as the rest of its batch, and
// then publishes the message to its dead-letter queue (by default
// QueueName of the queue: payments.dlq for payments) with headers that say
// why and whose it is (the Header constants): x-idem-reason, x-idem-error,
// x-idem-consumer, x-idem-message-id, x-idem-attempts, x-idem-payload-hash.
// The row answers
// "what happened to message X" from SQL; List reads it:
//
//	recs, err := deadletters.List(ctx, pool, tables, deadletters.Filter{Reason: "max_attempts"})
//
// List pages newest first: the next page is Filter.Before the last row's
// ID. Groups answers "what is waiting, and since when": the dead letters
// not redriven, grouped by reason (or by consumer and reason), each group
// with its count, oldest and newest. It reads a few index entries per
// group and at most GroupFilter.CountCap of each (10,000 by default; a
// group with more says so), however many dead letters there are:
//
//	groups, more, err := deadletters.Groups(ctx, pool, tables, deadletters.GroupFilter{By: deadletters.ByConsumerReason})
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
// # Each message to its own rows
//
// Redrive matches each message to its dead-letter row and its inbox row by
// (consumer, message id), never by its payload: two messages with one body
// are two messages. idem's own copy names both (x-idem-consumer and
// x-idem-message-id, the id its row records; `idem deadletters list` shows
// it, and --id selects by it), and its row is the oldest one not yet
// redriven that also holds its reason and payload hash. A message the
// broker dead-lettered itself (x-death: a quorum queue's delivery limit)
// names no consumer of idem's, whatever x-idem- headers its publisher set:
// it is judged for RedriveOptions.Consumer, by its message-id property, and
// a row is its own only if it also holds its payload. Redrive marks only
// that row and touches only that inbox row.
//
// # The horizon
//
// A message goes back only if it entered the dead-letter queue after the
// newest sighting retention made its consumer forget (inbox.Inbox.CheckSeen):
// it entered when its own dead-letter row was written, or, for a message
// the broker dead-lettered, at its x-death time. A message whose row is gone
// (retention deleted it), or that names no consumer while
// RedriveOptions.Consumer is empty, cannot be judged. Redrive leaves those
// in the dead-letter queue, moves the others, lists them in
// RedriveResult.Refusals with why, and returns an error wrapping
// inbox.ErrBeyondHorizon; RedriveOptions.AllowBeyondHorizon moves them
// anyway, to be applied as new.
//
// # Never lost, kept in order
//
// Redrive takes the messages from the head of the dead-letter queue, at
// most as many as it held when Redrive started. It publishes a copy of
// each, with publisher confirms and the mandatory flag: a matching message
// to the queue, any other back to the dead-letter queue's tail as it is.
// It marks the own dead-letter rows of the moved ones (redriven_at,
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
