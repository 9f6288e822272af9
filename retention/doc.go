// Package retention keeps idem's tables from growing forever: it deletes,
// in small chunks, what idem no longer needs to recognise a message it has
// seen, and refuses to delete what it may still need.
//
// # What is cleaned
//
// Clean walks every table idem owns, each in chunks of Config.ChunkSize
// rows, every chunk a single statement in its own short transaction. The
// package that owns a table writes its statement (inbox.Inbox.Cleanup,
// ledger.DeleteSettled, deadletters.DeleteBefore, replay.DeleteFinishedRuns,
// httpinbox.CleanupExpired, and the engine's for the attempts table);
// retention decides the cutoff, refuses one below the floor, and calls
// them:
//
//   - inbox: rows received before the cutoff (now() - Config.OlderThan);
//   - ledger and ledger_audit: effects settled before the ledger's own
//     cutoff (now() - Config.LedgerOlderThan, by default the longer of
//     OlderThan and 180 days): succeeded, suppressed, and failed_terminal
//     once an operator resolved them so, with their audit rows. Pending,
//     in-flight, retryable, unknown and unresolved failed_terminal effects
//     are never deleted. Each deleted effect leaves a tombstone;
//   - ledger_tombstones: kept, unless Config.TombstonesOlderThan is set;
//   - dead_letters: rows dead-lettered before the cutoff;
//   - replay_runs, replay_audit and checkpoints: replay runs finished (or
//     abandoned) before the cutoff, their audit rows and their progress
//     checkpoints;
//   - attempts: the failure counts of messages last retried before the
//     cutoff;
//   - http_keys: HTTP idempotency keys past their own expiry and
//     tombstone; an unknown outcome stays until an operator resolves it.
//
// It returns a Count per table: what it deleted, and the table's cutoff.
// The command line runs the same call:
//
//	idem cleanup --older-than 720h [--ledger-older-than 4320h] [--tombstones-older-than D] [--schema S] [--prefix P]
//
// # The ledger's horizon
//
// Money movements outlive the messages that caused them: a settled effect
// keeps its row (request, response, audit trail) for Config.LedgerOlderThan,
// 180 days by default, longer than a typical inbox retention. When it goes,
// ledger.DeleteSettled leaves a tombstone in the same statement (the effect
// id, its idempotency key, how and when it settled, when it was deleted),
// and ledger.Record writes an effect recorded again under that id as
// suppressed: a repair, a rebuild or a redrive after retention never sends
// it twice. Tombstones are kept for good unless Config.TombstonesOlderThan
// says otherwise; set it only past the longest time anything can record an
// effect again.
//
// # The floor
//
// A deleted inbox row turns the next delivery of its message into a new
// message, and the handler runs again. So Clean refuses, with ErrBelowFloor
// and before deleting anything, an OlderThan (or LedgerOlderThan, or a set
// TombstonesOlderThan) shorter than Config.Floor: the
// horizon within which a message may still come back (an ack lost with a
// connection, a producer retrying after an outage, a normal replay into the
// live consumer's inbox). The default, DefaultFloor, is seven days. Raise it
// to the retention (max-age) of the streams you may replay from; lower it
// only as a decision, with Config.Floor or `idem cleanup --floor`.
//
// A row's age counts from the last copy of its message that was claimed,
// not the first. What the inbox forgets is recorded per consumer and
// source (see inbox.Inbox.Horizon), and every door through which an old
// message can come back asks it: a normal replay that would start at or
// below it, and a redrive of a message that entered the dead-letter queue
// before it, refuse unless told otherwise (replay.Options.AllowBelowHorizon,
// deadletters.RedriveOptions.AllowBeyondHorizon). A running online
// rebuild's inbox scope is never cleaned (inbox.Inbox.Hold).
//
// # In-process schedule
//
// Run cleans on a schedule inside a worker, beside consumer.Run: shortly
// after it starts, then every Config.Interval plus a random Config.Jitter.
// Each round takes a PostgreSQL advisory lock without waiting, so among
// any number of workers one cleans at a time; each round is bounded by
// Config.RoundTimeout, and a failed round is logged and retried at the next
// one.
//
// Two gauges say whether it keeps up: idem.retention.interval is
// Config.Interval, and idem.retention.last_success.timestamp the time the
// last cleanup went through (Run sets it to its start until its first
// round does). The alert IdemRetentionStalled of
// docs/prometheus/idem-alerts.yml fires when, among the processes that run
// it, none went through for twice the interval.
package retention
