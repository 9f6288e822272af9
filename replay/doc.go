// Package replay runs a consumer's handler over a bounded range of a
// RabbitMQ stream: from the first record, an offset or a time, to an end
// fixed when the replay starts (the tail at that moment, an offset or a
// time), and then it stops by itself. Run takes the *consumer.Consumer a
// worker builds to read the stream live (one with a Config.Stream), and
// every batch runs through the same pipeline as live consumption (payload
// hash, inbox, one transaction per batch, a savepoint per message), in one
// of four modes:
//
//   - idem.Normal behaves like the live consumer: the live inbox scope skips
//     what was processed, new effects are dispatched.
//   - idem.Rebuild rebuilds a projection, with effects recorded as
//     suppressed and never dispatched and an inbox scope private to the
//     run. With Options.Projection it runs online, beside the live
//     consumer (below). Without it, it runs in place: Options.Reset runs
//     first (truncate the projection), it holds the live consumer's stream
//     lock, so live reading pauses, and at the end moves the live
//     consumer's checkpoint to the run's end (the hand-off). Messages past
//     the live checkpoint are caught up the way the live consumer would
//     have: live inbox scope, effects dispatched.
//   - idem.Forensic writes nothing: READ ONLY transactions, always rolled
//     back; the inbox is looked up, handlers run (and fail if they write),
//     effects are captured in memory; a JSON-lines report (ReportLine,
//     ReportSummary) says for each message what the live inbox holds and
//     what the handler did, in the claim's decision names and the outcome
//     names. Conflicts, failed handlers or dead letters make Run return
//     ErrFindings (exit code 1 from package replaycmd).
//   - idem.Repair re-runs only the selected messages (by business key or
//     message id) even if they were processed, in the live inbox scope,
//     each leaving an audit row (run id, operator, reason, outcome).
//     Effects stay deduplicated by effect id unless Options.Redispatch asks
//     for the failed and unknown ones to be sent again.
//
// # Online rebuilds
//
// An online rebuild builds the projection's declared tables again (see
// package projection) beside the live ones, while the live consumer
// (its Run, in any process) keeps consuming into the live tables and
// readers keep reading them:
//
//   - building: it creates a shadow of each table (CREATE TABLE … LIKE …
//     INCLUDING ALL, with the live table's grants and foreign keys) and
//     replays the stream into the shadows up to the live consumer's
//     checkpoint; the handler's Projection.Table names the shadows;
//   - catching up: the live consumer moved on meanwhile; it replays again up
//     to its new checkpoint, until the lag is at most BatchSize messages
//     (or stops shrinking);
//   - swapping: one transaction takes the live consumer's swap gate, an
//     advisory lock its batches take in shared mode as they begin: the live
//     batch in flight commits first, the next one waits. It applies the
//     few messages the live consumer committed since, hands the inbox over
//     (the live scope then knows exactly the messages the rebuilt tables
//     hold, but what retention made it forget), replaces each live table
//     with its shadow (DROP, RENAME, index names restored) and finishes the
//     run. Readers wait for the last statements only (at most 2s, else the
//     swap is postponed) and then read the rebuilt tables: never a missing,
//     empty or partial table. The live consumer goes on from its own
//     checkpoint, on the new tables: no gap, no double apply.
//
// The swap holds the live consumer at most 10s (half its HandlerTimeout if
// less); a swap that would take longer is postponed, and tried again after
// catching up (up to 5 times). Summary.Pause says how long it held it.
// An online rebuild needs three connections of the consumer's pool.
//
// An interrupted online rebuild leaves the live tables and the live
// consumer untouched, and its shadows in place: run it again with its
// RunID to resume it, or Abandon it (--abandon) to drop them. Another
// rebuild of the consumer cannot start meanwhile (ErrRebuildPending).
// Objects that depend on a live table (views, other tables' foreign keys,
// serial sequences) make it refuse to start: the swap could not drop the
// table.
//
// Except forensic ones, runs are recorded in the replay_runs table and
// checkpointed in each batch's transaction: a run killed midway resumes
// where it stopped when started again with the same RunID, without applying
// anything twice, and stops at the end fixed the first time.
//
// Every mode asks the live consumer's inbox horizon (inbox.Inbox.Horizon):
// the highest offset at which retention made it forget a copy of a
// message. There the inbox no longer knows whether a message was applied,
// and its handler could run again. A normal replay refuses, with an error
// wrapping inbox.ErrBeyondHorizon, a range that starts at or below it —
// when it starts and when it resumes; start after it, or set
// Options.AllowBelowHorizon to do it anyway. A cleanup may run while a
// replay reads: each batch transaction asks the horizon again for the first
// message it claims as new, and a message now below it ends the run, its
// batch rolled back (a rebuild's catch-up, which claims in the live scope,
// does the same). A rebuild holds its own inbox
// scope against retention until it swaps or is abandoned (inbox.Hold), and
// refuses to resume if rows of it were deleted anyway; its swap keeps the
// live horizon. A forensic replay reports the messages at or below the
// horizon as "forgotten". A repair re-runs its selection on purpose.
// ListRuns (and `idem replay runs`) lists the recorded runs with their
// audit counts.
//
// A handler that fails is retried in place with backoff up to the
// consumer's MaxAttempts, then dead-lettered (max_attempts) and counted as a
// handler error; the replay goes on.
//
// Package replay/replaycmd turns this into a subcommand of a worker binary:
// replay --mode … --from … --to ….
package replay
