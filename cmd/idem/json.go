package main

import (
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/ledger"
)

// The --json shapes: snake_case keys, times in RFC 3339 UTC, null for what
// is absent. They are the command's interface; change them as carefully as
// its flags.

// at returns t in UTC, or nil for the zero time.
func at(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// entryJSON is one element of `idem ledger list --json`.
type entryJSON struct {
	EffectID    string `json:"effect_id"`
	EffectType  string `json:"effect_type"`
	Status      string `json:"status"`
	Consumer    string `json:"consumer"`
	MessageID   string `json:"message_id"`
	BusinessKey string `json:"business_key"`
	// IdempotencyKey is sent with every attempt.
	IdempotencyKey string     `json:"idempotency_key"`
	Target         string     `json:"target"`
	AttemptCount   int        `json:"attempt_count"`
	LastError      string     `json:"last_error"`
	CreatedAt      *time.Time `json:"created_at"`
	CompletedAt    *time.Time `json:"completed_at"`
}

func newEntryJSON(e ledger.Entry) entryJSON {
	return entryJSON{EffectID: e.ID, EffectType: e.Type, Status: string(e.Status), Consumer: e.Consumer,
		MessageID: e.MessageID, BusinessKey: e.BusinessKey, IdempotencyKey: e.IdempotencyKey, Target: e.Target,
		AttemptCount: e.AttemptCount,
		LastError:    e.LastError, CreatedAt: at(e.CreatedAt), CompletedAt: at(e.CompletedAt)}
}

// effectJSON is `idem ledger show --json`: the entry, its request and
// response, and the operator decisions about it.
type effectJSON struct {
	entryJSON
	NextAttemptAt *time.Time    `json:"next_attempt_at"`
	LockedUntil   *time.Time    `json:"locked_until"`
	LockOwner     string        `json:"lock_owner"`
	RequestHash   string        `json:"request_hash"`
	Request       *string       `json:"request"`
	ResponseHash  *string       `json:"response_hash"`
	Response      *string       `json:"response"`
	History       []historyJSON `json:"history"`
}

// historyJSON is one operator decision.
type historyJSON struct {
	Operator string    `json:"operator"`
	From     string    `json:"from"`
	To       string    `json:"to"`
	Reason   string    `json:"reason"`
	At       time.Time `json:"at"`
}

func newEffectJSON(e ledger.Entry, history []ledger.AuditRecord) effectJSON {
	out := effectJSON{entryJSON: newEntryJSON(e), NextAttemptAt: at(e.NextAttemptAt),
		LockedUntil: at(e.LockedUntil), LockOwner: e.LockOwner, RequestHash: e.RequestHash.String(),
		Request: text(e.Request), History: []historyJSON{}}
	if !e.ResponseHash.IsZero() {
		h := e.ResponseHash.String()
		out.ResponseHash, out.Response = &h, text(e.Response)
	}
	for _, h := range history {
		out.History = append(out.History, historyJSON{Operator: h.Operator, From: string(h.From), To: string(h.To),
			Reason: h.Reason, At: h.At.UTC()})
	}
	return out
}

// text returns b as a string when it is UTF-8 text (a JSON request, say),
// and as hex otherwise; nil for nil.
func text(b []byte) *string {
	if b == nil {
		return nil
	}
	s := printable(b)
	if !utf8.Valid(b) {
		s = "hex:" + s
	}
	return &s
}

// ledgerStatsJSON is `idem ledger stats --json`.
type ledgerStatsJSON struct {
	Counts map[string]int64 `json:"counts"`
	// Estimated lists the statuses whose count is the planner's estimate.
	Estimated        []string `json:"estimated"`
	OldestDueSeconds float64  `json:"oldest_due_seconds"`
}

// resolvedEffectJSON is one element of `idem ledger resolve --json`: what
// became of one effect.
type resolvedEffectJSON struct {
	EffectID string `json:"effect_id"`
	Resolved bool   `json:"resolved"`
	// From is the status the effect was in; null when it was not found.
	From *string `json:"from"`
	// Status is the status it is in now; null when it was not found.
	Status *string `json:"status"`
	// Error says why it was refused; null when it was resolved.
	Error *string `json:"error"`
}

func newResolvedEffectJSON(r ledger.ResolveResult) resolvedEffectJSON {
	now := string(r.From)
	if r.Resolved() {
		now = string(r.Entry.Status)
	}
	return resolvedEffectJSON{EffectID: r.ID, Resolved: r.Resolved(), From: jsonText(string(r.From)), Status: jsonText(now),
		Error: errText(r.Err)}
}
