package replay

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/safetext"
	"github.com/idemkit/idem/ledger"
)

// ReportLine is one message of a forensic report: one JSON object per line,
// in stream order. The fields hold no time and no run id, so that the same
// stream and database give the same report.
type ReportLine struct {
	// Kind is "message".
	Kind string `json:"kind"`
	// Offset is the message's stream offset.
	Offset int64 `json:"offset"`
	// MessageID is the message's id; empty when it has none.
	MessageID string `json:"message_id"`
	// BusinessKey is the message's business key, when the consumer has one.
	BusinessKey string `json:"business_key,omitempty"`
	// PayloadHash is the payload hash, in hex.
	PayloadHash string `json:"payload_hash"`
	// Inbox is what the live consumer's inbox holds for the message id, in
	// the claim's decision names (inbox.Decision): "duplicate" (processed,
	// with this payload), "new" (not processed), "conflict" (another
	// payload under the id); or "forgotten" (no row, but the message is at
	// or below the inbox horizon: retention may have deleted the row of a
	// message that was processed), or "invalid" (the message could not be
	// looked up: no id, too large…).
	Inbox string `json:"inbox"`
	// StoredHash is the hash the inbox holds, for "conflict".
	StoredHash string `json:"stored_hash,omitempty"`
	// Outcome is what became of the message, in the outcome names
	// (idem.Outcome): "processed" (the handler succeeded), "retried" (it
	// failed and would be retried) or "dead_lettered" (the handler, or the
	// runtime for bad input, rejected it for good).
	Outcome string `json:"outcome"`
	// Reason is the dead-letter reason, for "dead_lettered".
	Reason string `json:"reason,omitempty"`
	// Error is the handler's error.
	Error string `json:"error,omitempty"`
	// Effects are the effects the handler would record.
	Effects []ReportEffect `json:"effects"`
}

// ReportEffect is an effect a handler would record during a forensic replay.
type ReportEffect struct {
	// EffectID is the effect's id in the ledger.
	EffectID string `json:"effect_id"`
	// Type is the effect type.
	Type string `json:"type"`
	// BusinessKey is the effect's business key.
	BusinessKey string `json:"business_key"`
	// Target is where the effect would go.
	Target string `json:"target,omitempty"`
	// RequestHash is the SHA-256 of the request, in hex.
	RequestHash string `json:"request_hash"`
}

// ReportSummary is the last line of a forensic report.
type ReportSummary struct {
	// Kind is "summary".
	Kind string `json:"kind"`
	// EndOffset is the end fixed at start; -1 for an empty stream.
	EndOffset int64 `json:"end_offset"`
	// FirstOffset and LastOffset are the first and last offsets reported;
	// -1 when none.
	FirstOffset int64 `json:"first_offset"`
	LastOffset  int64 `json:"last_offset"`
	// Messages counts the message lines.
	Messages int64 `json:"messages"`
	// InboxNew, InboxDuplicate, Conflicts and Forgotten count the inbox
	// states.
	InboxNew       int64 `json:"inbox_new"`
	InboxDuplicate int64 `json:"inbox_duplicate"`
	Conflicts      int64 `json:"conflicts"`
	Forgotten      int64 `json:"forgotten"`
	// Retried and DeadLettered count the outcomes other than processed.
	Retried      int64 `json:"retried"`
	DeadLettered int64 `json:"dead_lettered"`
	// Effects counts the effects the handlers would record.
	Effects int64 `json:"effects"`
}

// reporter writes a forensic report.
type reporter struct {
	enc *json.Encoder // nil: no report wanted
}

func newReporter(w io.Writer) *reporter {
	if w == nil {
		return &reporter{}
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return &reporter{enc: enc}
}

// inboxState names what the inbox holds for a message: its decision's
// name, "invalid" when it made none.
func inboxState(d inbox.Decision) string {
	if d == 0 {
		return "invalid"
	}
	return d.String()
}

// message reports one message; forgotten marks a message at or below the
// inbox horizon.
func (p *reporter) message(it *engine.Item, res engine.Result, effects []ledger.Entry, forgotten bool) error {
	if p.enc == nil {
		return nil
	}
	m := it.Message
	line := ReportLine{
		Kind: "message", Offset: it.Offset, MessageID: m.ID, BusinessKey: m.BusinessKey,
		PayloadHash: m.Hash.String(), Inbox: inboxState(res.Inbox), Outcome: res.Outcome.String(), Effects: []ReportEffect{},
	}
	if res.Inbox == inbox.Conflict {
		line.StoredHash = res.StoredHash.String()
	}
	if forgotten {
		line.Inbox = "forgotten"
	}
	switch res.Outcome {
	case idem.Retried:
		line.Error = safetext.Error(res.Err)
	case idem.DeadLettered:
		line.Reason, line.Error = res.Reason, safetext.Error(res.Err)
	}
	for _, e := range effects {
		line.Effects = append(line.Effects, ReportEffect{EffectID: e.ID, Type: e.Type, BusinessKey: e.BusinessKey,
			Target: e.Target, RequestHash: e.RequestHash.String()})
	}
	if err := p.enc.Encode(line); err != nil {
		return fmt.Errorf("replay: write report: %w", err)
	}
	return nil
}

func (p *reporter) summary(s Summary) error {
	if p.enc == nil {
		return nil
	}
	err := p.enc.Encode(ReportSummary{
		Kind: "summary", EndOffset: s.End, FirstOffset: s.First, LastOffset: s.Last, Messages: s.Messages,
		InboxNew: s.InboxNew, InboxDuplicate: s.InboxDuplicate, Conflicts: s.Conflicts, Forgotten: s.Forgotten,
		Retried: s.Retried, DeadLettered: s.DeadLettered, Effects: s.Effects,
	})
	if err != nil {
		return fmt.Errorf("replay: write report: %w", err)
	}
	return nil
}
