// Package replay runs a consumer's handler over a bounded range of a
// RabbitMQ stream: from the first record, an offset or a time, to an end
// fixed when the replay starts (the tail at that moment, an offset or a
// time), and then it stops by itself. Every batch runs through the same
// pipeline as live consumption (consumer.ProcessWith: payload hash, inbox,
// one transaction per batch, a savepoint per message), in one of four modes:
//
//   - idem.Normal behaves like the live consumer: the live inbox scope skips
//     what was processed, new effects are dispatched.
//   - idem.Rebuild rebuilds a projection: Options.Reset runs first (truncate
//     the projection), the inbox scope is private to the run, effects are
//     recorded as suppressed and never dispatched. It holds the live
//     consumer's stream lock, so live reading pauses, and at the end moves
//     the live consumer's checkpoint to the run's end (the hand-off):
//     live consumption continues after it, without gap or overlap.
//     Messages past the live checkpoint, which the live consumer never
//     processed, are caught up the way it would have: live inbox scope,
//     effects dispatched.
//   - idem.Forensic writes nothing: READ ONLY transactions, always rolled
//     back; the inbox is looked up, handlers run (and fail if they write),
//     effects are captured in memory; a JSON-lines report (ReportLine,
//     ReportSummary) says for each message what the live inbox holds and
//     what the handler did. Conflicts or handler errors make Run return
//     ErrFindings, and ExitCode 1.
//   - idem.Repair re-runs only the selected messages (by business key or
//     message id) even if they were processed, in the live inbox scope,
//     each leaving an audit row (run id, operator, reason, outcome).
//     Effects stay deduplicated by effect id unless Options.Redispatch asks
//     for the failed and unknown ones to be sent again.
//
// Except forensic ones, runs are recorded in the replay_runs table and
// checkpointed in each batch's transaction: a run killed midway resumes
// where it stopped when started again with the same RunID, without applying
// anything twice, and stops at the end fixed the first time.
//
// A normal replay refuses (ErrBelowHorizon) to start at or below the inbox
// horizon: the highest offset whose inbox row retention deleted for the live
// consumer (see the retention package and inbox.Inbox.Horizon). There the
// inbox no longer knows the message was applied, and the handler would run
// again. Start after it, or set Options.AllowBelowHorizon to do it anyway.
// ListRuns (and `idem replay runs`) lists the recorded runs with their
// audit counts.
//
// A handler that fails is retried in place with backoff up to the
// consumer's MaxAttempts, then dead-lettered (max_attempts) and counted as a
// handler error; the replay goes on.
//
// Main turns this into a subcommand of a worker binary: replay --mode …
// --from … --to ….
package replay
