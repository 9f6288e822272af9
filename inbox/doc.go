// Package inbox records which messages a consumer has processed, inside the
// same PostgreSQL transaction as the handler's own writes, so that a message
// delivered twice changes the database once.
//
// The consumer runtime (package consumer) claims every message for you. Use
// this package directly to build a consumer of your own, or to answer an
// operator's "was message X processed?".
//
// # Claiming a message
//
// The inbox is one table with a row per (consumer, message id) holding the
// payload's hash. A claim inserts that row in the caller's transaction with
// INSERT … ON CONFLICT DO NOTHING, never check-then-insert, and decides:
//
//   - NewMessage: the row was inserted by this transaction; run the handler.
//   - Duplicate: the row exists with the same payload hash; the message was
//     processed before (or earlier in this transaction); ack it, skip the
//     handler.
//   - Conflict: the row exists with a different payload hash; the id was
//     reused for another payload. Never process it and never ack it as a
//     duplicate: dead-letter it and report both hashes.
//
// For example, with the handler's write in the claim's transaction:
//
//	res, err := ib.Claim(ctx, tx, inbox.Claim{
//		Consumer:    "billing",
//		MessageID:   "msg-0001",
//		PayloadHash: idem.HashBytes(body),
//		BusinessKey: "o-1",
//		Source:      "orders",
//	})
//	if err != nil {
//		return err
//	}
//	switch res.Decision {
//	case inbox.NewMessage:
//		_, err = tx.Exec(ctx, pay) // the handler's write, in the claim's transaction
//		return err
//	case inbox.Duplicate:
//		return nil // processed before: ack without running the handler
//	default: // inbox.Conflict: the id was reused for another payload
//		fmt.Println("conflict: payload", idem.HashBytes(body).Short(), "stored", res.StoredHash.Short())
//		return nil // dead-letter it; never process it, never ack it as a duplicate
//	}
//
// The claim commits or rolls back with the transaction: a claim in a
// rolled-back transaction leaves no trace. Concurrent claims of one id wait
// for each other on the primary key, so exactly one of them is NewMessage.
// Claims run under READ COMMITTED (PostgreSQL's default); under REPEATABLE
// READ or SERIALIZABLE a claim that races a concurrent commit fails with a
// serialization error and the caller retries the transaction.
//
// # Batches
//
// ClaimBatch claims a whole batch with one statement and returns what Claim
// would have returned for each message in turn, a repeated id included.
// ClaimNewBatch is cheaper for batches expected to be new: a plain INSERT
// that fails with ErrClaimed when any message is claimed already, after
// which the caller rolls back and claims the batch with ClaimBatch. Unclaim
// removes a claim this transaction made, after ROLLBACK TO SAVEPOINT, so that
// a message whose handler failed is not recorded as processed. Invalid
// input (an empty or over-long id, invalid UTF-8, a zero hash) is refused
// with a *ValidationError before anything is sent.
//
// # Which hash
//
// idem.HashBytes hashes the raw body: exact and cheap. idem.HashJSON hashes
// its canonical JSON, for publishers that may re-serialise the same document
// with other key order, whitespace or number spelling. Pick one per consumer
// and keep it: changing it turns redeliveries of old messages into
// conflicts.
//
// # Retention and the horizon
//
// A row deleted too early turns the next delivery of its message into
// NewMessage, and the handler runs again. A claim that finds its row
// records the sighting on it (Record.SeenAt, Record.SeenOffset), so a row's
// age counts from the last copy of its message that came. Cleanup deletes
// rows last seen before a retention that must outlast every redelivery and
// replay horizon, in small chunks, never below a floor of seven days
// (DefaultFloor) and never in a held scope (Hold: an online rebuild's), and
// records what it made each consumer forget (Horizon). Every door through
// which an old message can come back asks it first (CheckOffset,
// CheckSeen) and refuses with ErrBeyondHorizon: a normal replay, a
// redrive, a rebuild's resume. Package retention cleans this table with
// every other table of idem; `idem cleanup` runs it.
//
// # Partitions
//
// LayOutPartitioned (`idem migrate --partition-width`) lays an empty inbox
// out in time partitions on each row's last sighting (ConvertPartitioned
// converts one that holds rows, online, its table becoming the partition of
// the times before the conversion), and Cleanup then
// drops whole partitions that end before the cutoff, recording their
// horizon in the same transaction. EnsurePartitions, which every Cleanup
// calls, makes the partitions ahead; a row no partition covers goes to the
// default partition meanwhile, so a claim never fails for want of one. No
// index spans the partitions: a claim takes a transaction-level advisory
// lock per key, then looks the key up in every partition, so a copy claimed
// in an earlier partition is still a duplicate or a conflict. The cost is a
// statement per batch and an index probe per partition per key.
//
// # Operators
//
// Lookup returns the row of one message (`idem inbox show`), Stats the row
// count and age range per consumer (`idem inbox stats`).
package inbox
