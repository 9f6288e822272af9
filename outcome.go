package idem

// Outcome is what became of one message: the one vocabulary of the
// runtime, its sources, consumer.Process, the metrics
// (idem.consumer.messages) and the stats.
type Outcome uint8

// The outcomes. The zero value means "not decided yet". consumer.Process
// reports the first five. A queue consumer settles each message as one of
// the first five; a message it Postponed runs again in a later batch; with
// an ordering key it retries a Retried message in place, holding its key's
// later messages (Held). An ordered source (a stream, a replay) retries a
// Retried message in place, holding the messages after it (Held), and
// settles each message as Processed, Duplicate or DeadLettered (a forensic
// replay reports Retried instead of retrying); a repair replay leaves the
// messages it did not select Skipped.
const (
	// Processed: the handler ran and its writes committed with the inbox row.
	Processed Outcome = iota + 1
	// Duplicate: the inbox held the id with the same payload hash; the
	// handler did not run.
	Duplicate
	// DeadLettered: the message cannot be processed; its dead-letter row
	// committed, with the reason.
	DeadLettered
	// Retried: the handler failed; nothing committed for the message; it
	// is tried again later (the retry queue, or in place where order is
	// kept).
	Retried
	// Unresolved: the batch transaction failed; nothing committed; the
	// message goes back to its source.
	Unresolved
	// Skipped: not selected by a repair replay; nothing was done.
	Skipped
	// Held: not attempted, because an earlier message of an ordered batch
	// (of its key, in a queue with an ordering key) is being retried; it
	// runs again after that one.
	Held
	// Postponed: it left its batch before writing anything, because another
	// batch in flight writes its row; it runs in a later batch.
	Postponed

	// MaxOutcome is the last outcome: arrays indexed by Outcome
	// (consumer.Stats.ByOutcome) have MaxOutcome+1 elements. A new outcome
	// goes before it, and MaxOutcome names it; outcomeNames names it, and
	// Final and Copied say how the sources settle it. The metrics, the
	// stats and the queue source's acks follow from those.
	MaxOutcome = Postponed
)

// outcomeNames are the outcomes' metric and log names.
var outcomeNames = [...]string{
	Processed: "processed", Duplicate: "duplicate", DeadLettered: "dead_lettered", Retried: "retried",
	Unresolved: "unresolved", Skipped: "skipped", Held: "held", Postponed: "postponed",
}

// String is the outcome's metric and log name: processed, duplicate,
// dead_lettered, retried, unresolved, skipped, held or postponed.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return "undecided"
}

// Final reports whether o settles its message for good: processed,
// duplicate, dead-lettered or skipped.
func (o Outcome) Final() bool {
	return o == Processed || o == Duplicate || o == DeadLettered || o == Skipped
}

// Copied reports whether a queue source settles o by storing a copy of the
// message before it acks it: dead-lettered (the dead-letter queue) and
// retried (the retry queue). A final outcome that is not copied is acked
// as it is; any other is handed back to the queue.
func (o Outcome) Copied() bool { return o == DeadLettered || o == Retried }

// Outcomes lists every outcome, in order.
func Outcomes() []Outcome {
	out := make([]Outcome, 0, len(outcomeNames)-1)
	for o := Processed; o <= MaxOutcome; o++ {
		out = append(out, o)
	}
	return out
}
