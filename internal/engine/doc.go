// Package engine is idem's one batch pipeline. A source (the AMQP queue, a
// stream, a replay, consumer.Process) hands it messages; the engine derives
// their identity, runs a batch of them in one PostgreSQL transaction — claim
// every id in the inbox with one statement, run the handler of each new
// message (back to back, or in a savepoint each), flush deferred writes,
// write dead-letter rows and attempt counts, commit — and reports each
// message's Result. The source then acks, checkpoints or retries, and counts.
//
// Around that transaction the engine holds every policy the sources share:
// the fallbacks (a duplicate met by a plain INSERT claim, a handler error in
// a batch without savepoints), the retry of a failed transaction (split in
// halves, cheap conflicts through a short lock_timeout), the handler
// deadline and the abandonment of a handler that ignores it, the isolation
// of suspected poison messages, the admission of concurrent batches, and the
// one ordered loop that streams and replays use. What differs from source to
// source is its policy, one type per source, beside the door it comes in
// by: Queue for Run and RunAlone (run.go), Ordered for RunOrdered (a stream
// reader, each replay mode; ordered.go), none for RunWithoutRetries
// (consumer.Process). Each turns into the rules a batch reads (policy.go).
//
// # Files and types
//
// The files follow the flow, and each type lives whole in one of them:
// engine.go (the Engine, its way in, PrepareAll, and out, Count, and the
// Counters that Stats and the metrics read), run.go (Run, the queue's
// policy, the retry loop that splits a failing batch), ordered.go
// (RunOrdered and the ordered sources' policy), supervisor.go (the governor
// that admits each try, the goroutine an attempt runs on, the abandonment
// of a handler that ignores its deadline, and the Vitals the health report
// reads), attempt.go (the attempt's transaction, and writeKeys, the table
// of the rows the attempts in flight hold), handlers.go (the handlers, the
// guarded transaction they get, and the watch the supervisor reads),
// telemetry.go (the Telemetry: metrics and spans). Off the success path:
// records.go (what a failure writes), isolate.go (RunAlone),
// batchhandler.go, violations.go (a handler that reaches past the guard),
// item.go, policy.go, lifecycle.go.
//
// # The path of a queue message
//
// A new message from a queue, on its way to success, runs in ten files of
// the runtime, from the moment its delivery is on the channel until it is
// acked and counted. A file is entered when a function of another file
// calls into it; a return is not an entry. None is entered more than twice.
// make path measures the path and fails when it no longer matches this list
// (see bench/path):
//
//  1. consumer/source.go: the session's router, waiting on the channel,
//     takes each delivery off it (loop, burst).
//  2. consumer/window.go: take puts the delivery in the session's window of
//     unsettled deliveries: the acker will ack it, the gate counts its
//     bytes. Back in burst, message makes it its idem.Message.
//  3. internal/engine/engine.go: PrepareAll derives each message's identity
//     (derive: hash, id, business key) or its rejection, wraps it in an
//     Item, and counts it received.
//  4. consumer/session.go: screened dead-letters the item of a delivery
//     whose properties the AMQP client could not decode. Back in source.go,
//     route hands it to a worker (by ordering key), the worker collects a
//     batch and runBatch calls Engine.Run with the queue's policy.
//  5. internal/engine/run.go: Run turns the policy into the batch's rules
//     (Queue.rules) and runs its retry loop (run), which retries or splits a
//     batch whose transaction fails.
//  6. internal/engine/supervisor.go: admitted has the governor admit the
//     try, runs it the cheapest way that works (once) on a goroutine of its
//     own (supervised, counted in the Vitals), and tells the governor how it
//     went.
//  7. internal/engine/attempt.go: attempt is the transaction: newBatch,
//     begin (beginSQL: lock bounds, the batch lock), decideFixed, claim.
//  8. internal/engine/telemetry.go: startBatch starts each message's span
//     and records the batch's size.
//  9. inbox/claim.go: ClaimNewBatch checks the claims and inserts them with
//     one statement. Back in attempt.go, claim hands the decisions on.
//  10. internal/engine/handlers.go: runHandlers runs each new message's
//     handler under its deadline (runOne, call, handle), marked in and out
//     of the watch the supervisor reads.
//  11. internal/engine/handlers.go again, from the handler: its tx.Exec goes
//     through the guarded transaction (handlerTx), which refuses
//     transaction control and names the row the statement writes.
//  12. internal/engine/attempt.go again: writeKeys.take records that row
//     among the rows the attempts in flight hold. Back in handlers.go, call
//     checks the transaction and decides the message's result.
//  13. internal/engine/supervisor.go again: Vitals.moved, a handler that
//     returned is progress. Back in attempt.go, commit flushes what the
//     handlers deferred, writes the records a failure leaves (hasRecords)
//     and commits; end closes the attempt.
//  14. internal/engine/telemetry.go again: endBatch ends the spans with each
//     message's result and records how long the handlers and the commit
//     took. Back in attempt.go, end releases the batch's rows (writeKeys)
//     and its connection; back in supervisor.go, the governor lets the try
//     go.
//  15. consumer/window.go again: back in source.go, runBatch calls settle,
//     which acks the batch (one multiple ack when it can) and gives its
//     bytes back.
//  16. internal/engine/engine.go again: Count adds the results to the
//     Counters, which Stats and the metrics read.
//
// Besides these, the path calls value methods of package idem (HashBytes,
// CheckID, Outcome.Final and Copied, the Deferred writes), internal/sqltext
// (the guard reads each handler statement's first word and names its row)
// and internal/amqpconn (the ack's write deadline, the screen of undecodable
// properties, and the session's gate, through which the AMQP client's
// reader read the delivery off the socket).
//
// A handler that defers its writes (consumer.Defer) adds the flush of
// package idem's Deferred; a duplicate takes the claim's second statement
// (ClaimBatch); a failure goes through records.go (dead-letter rows,
// attempt counts) and consumer/copies.go (the retry or dead-letter copy),
// or, with an ordering key, consumer/hold.go (the retry held in its worker,
// its key's later messages Held behind it). A redelivered message runs
// alone (isolate.go: RunAlone). A partitioned queue
// (consumer/partitioned.go) runs step 1 once per partition its process
// holds, each a queueSource of its own.
//
// # The path of a stream record
//
// A new record of a stream, on its way to its checkpoint, runs in nine
// files of the runtime, none entered more than twice:
//
//  1. consumer/streamsource.go: internal/streamio's reading loop
//     (Env.Follow, which the stream client's subscription fills) hands the
//     reader a batch of consecutive records (follow); batch makes them
//     idem.Messages (streamio.Messages).
//  2. internal/engine/engine.go: PrepareAll, as for a queue message.
//  3. internal/engine/ordered.go: RunOrdered turns the policy into the
//     rules (Ordered.rules), with the checkpoint each transaction writes,
//     and runs the batch.
//  4. internal/engine/run.go: run, the retry loop, as for a queue message.
//  5. internal/engine/supervisor.go: admitted.
//  6. internal/engine/attempt.go: attempt.
//  7. internal/engine/telemetry.go: startBatch.
//  8. inbox/claim.go: ClaimNewBatch.
//  9. internal/engine/handlers.go: runHandlers.
//  10. internal/engine/handlers.go again, from the handler: tx.Exec.
//  11. internal/engine/attempt.go again: writeKeys.take.
//  12. internal/engine/supervisor.go again: Vitals.moved.
//  13. internal/engine/ordered.go again: commit runs the rules'
//     beforeCommit, which finds the last offset before which every record
//     is settled (settledUpTo, with the offsets earlier commits settled:
//     rules.settled).
//  14. consumer/streamsource.go again: its Checkpoint writes it
//     (internal/store.AdvanceCheckpoint). Back in attempt.go, commit
//     commits and notes the offsets it settled.
//  15. internal/engine/telemetry.go again: endBatch.
//  16. internal/engine/engine.go again: back in RunOrdered, Count. Back in
//     streamsource.go, batch moves the lag's checkpoint.
//
// Besides these, the path calls the root package's value methods,
// internal/sqltext, internal/store (the checkpoint's statement) and
// internal/streamio, the stream client's plumbing (its subscription, the
// reading loop, the records made messages), as a queue message's calls
// internal/amqpconn. A retried record runs again in place, with the records
// after it, after a backoff (RunOrdered); a replay enters at step 3 with a
// policy of its own. A record the stream client could not decode
// (streamio.Record.Undecodable) has its item marked by Item.Undecodable
// in batch, after PrepareAll: it is dead-lettered as the queue's screened
// deliveries are.
//
// # Entries per file, before and after
//
// make path, run on the code before its types were grouped (each type in
// one file, methods called instead of fields written) and after:
//
//	                                   queue message    stream record
//	                                   before  after    before  after
//	consumer/source.go                      1      1         -      -
//	consumer/window.go                      2      2         -      -
//	consumer/session.go                     1      1         -      -
//	consumer/streamsource.go                -      -         2      2
//	internal/engine/engine.go               2      2         2      2
//	internal/engine/ordered.go              -      -         3      2
//	internal/engine/policy.go               1      -         1      -
//	internal/engine/run.go                  1      1         1      1
//	internal/engine/supervisor.go           -      2         -      2
//	internal/engine/attempt.go              2      2         2      2
//	internal/engine/telemetry.go            -      2         -      2
//	inbox/claim.go                          1      1         1      1
//	internal/engine/handlers.go             3      2         3      2
//	files                                   9     10         8      9
//	entries                                14     16        15     16
//
// Before, handlers.go was entered a third time by the release of the
// batch's rows (writeKeys.drop, from attempt.go) and ordered.go by a second
// closure of RunOrdered called from the commit; telemetry.go and the
// governor's and the Vitals' code were never entered as files of their
// own, because their fields were written, or their methods kept, in the
// files that used them. The counts after include what that hid: the spans
// (telemetry.go), the admission and the progress of attempts
// (supervisor.go).
//
// # The house around the engine, before and after
//
// The same step grouped the module by role. Arrows of imports, counted with
// go list on the build before it and after:
//
//   - from the runtime into the test harness: none before, none after; a
//     structure test (TestNoImportRunsFromTheRuntimeToTheTestKit) keeps it
//     so, and keeps the examples off internal/ altogether;
//   - from internal/ up into the public packages: 14 before, of which 11
//     were the harness (soak, soakworker, testdb, testbroker, testcluster,
//     testworker, exampleenv) importing what it tests while sitting beside
//     the engine; after, the harness lives in internal/testkit, above the
//     runtime it drives, and the runtime's own arrows are the engine's
//     three: deadletters (the reasons), health (Status) and inbox (the
//     claim);
//   - into the engine: two doors before (consumer.Consumer.Engine and
//     stream.Consumer.Engine, each taking an internal key type that showed
//     in go doc); one after, consumer.Consumer.Runtime, for replay, with no
//     internal type in any public package's go doc (a test checks it).
//
// Exported names per public package (go doc -short), before and after:
// consumer 21 and 21 (QueueOnly and Engine went, Stream, StreamURL and
// Runtime came); consumer/stream 4 and none (the package went into
// consumer); the root package 27 and 28 (canonical JSON's helpers went
// into internal/canonjson, ErrConfig came); deadletters 15 and 26 (the
// queue name, grouping, retry marks); ledger 32 and 35; inbox/httpinbox 71
// and 74; health 10 and 11; console and run are new (5 and 3); the others
// unchanged.
package engine
