package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/deadletters"
)

// checkDeadLetters checks that every expected dead letter is in the
// dead_letters table (and the dead-letter queue, for queues) with its
// reason, and that nothing else is. Copies of the same dead letter (a crash
// between the commit and the ack dead-letters the redelivery again) are
// counted, not failed.
func (h *harness) checkDeadLetters(ctx context.Context, rep *report, er *exampleReport, ex example, want []deadLetter) error {
	table, err := h.db.deadLetters(ctx, ex)
	if err != nil {
		return err
	}
	er.DeadLetters = len(want)
	er.DeadLetterRows = len(table)
	// A row of a message without an id is found by its payload hash.
	wantRows := make([]deadLetter, len(want))
	for i, d := range want {
		wantRows[i] = d
		if d.id == "" {
			wantRows[i].id = "sha256:" + hex.EncodeToString(d.hash[:])
		}
	}
	what := "every conflict and malformed message, and no valid one,"
	if ex == liveness {
		what = "every conflict, malformed, hung (handler_timeout) and poison (worker_crashed) message, and no valid one,"
	}
	rep.check(ex.String(), what+" in the dead_letters table with its reason",
		matchDeadLetters(wantRows, table) == nil, summarize(matchDeadLetters(wantRows, table), fmt.Sprintf("%d expected, %d rows", len(want), len(table))))
	if ex == orders {
		return nil // a stream consumer has no dead-letter queue
	}
	dlq := h.queue(ex) + ".dlq"
	queued, limited, err := h.readDLQ(ctx, dlq)
	if err != nil {
		return err
	}
	er.DeadLetterQueue = len(queued)
	rep.check(ex.String(), what+" in "+dlq+" with its x-idem-reason",
		matchDeadLetters(want, queued) == nil, summarize(matchDeadLetters(want, queued), fmt.Sprintf("%d expected, %d queued", len(want), len(queued))))
	rep.check(ex.String(), "idem dead-lettered before the broker's delivery limit: no x-death delivery_limit in "+dlq,
		len(limited) == 0, summarize(limited, fmt.Sprintf("%d queued, none by the broker", len(queued))))
	return nil
}

// matchDeadLetters lists what is missing from got, has another reason, or
// should not be there.
func matchDeadLetters(want, got []deadLetter) []string {
	type key struct {
		id   string
		hash [32]byte
	}
	seen := map[key][]string{}
	for _, d := range got {
		k := key{d.id, d.hash}
		seen[k] = append(seen[k], d.reason)
	}
	var bad []string
	expected := map[key]bool{}
	for _, d := range want {
		k := key{d.id, d.hash}
		expected[k] = true
		reasons := seen[k]
		switch {
		case len(reasons) == 0:
			bad = append(bad, fmt.Sprintf("%q (%s) missing", d.id, d.reason))
		case slices.ContainsFunc(reasons, func(r string) bool { return r != d.reason }):
			bad = append(bad, fmt.Sprintf("%q: reasons %v, want %s", d.id, reasons, d.reason))
		}
	}
	for k, reasons := range seen {
		if !expected[k] {
			bad = append(bad, fmt.Sprintf("%q dead-lettered (%v) but valid", k.id, reasons))
		}
	}
	sort.Strings(bad)
	return bad
}

// readDLQ reads every message of a dead-letter queue without taking it (the
// channel closes with the deliveries unacknowledged, so they go back). It
// also lists the messages the broker dead-lettered at the queue's delivery
// limit (an x-death entry with reason delivery_limit).
func (h *harness) readDLQ(ctx context.Context, queue string) (out []deadLetter, limited []string, err error) {
	conn, _, err := amqpnodes.Dial(ctx, h.cfg.amqpURLs, amqp.Config{})
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	for {
		d, ok, err := ch.Get(queue, false)
		if err != nil {
			return nil, nil, fmt.Errorf("read %s: %w", queue, err)
		}
		if !ok {
			return out, limited, nil
		}
		reason, _ := d.Headers[deadletters.HeaderReason].(string)
		if reason == "" {
			reason = "no x-idem-reason (dead-lettered by the broker?)"
		}
		out = append(out, deadLetter{id: d.MessageId, hash: hashOf(d.Body), reason: reason})
		if deathReason(d.Headers, "delivery_limit") {
			limited = append(limited, fmt.Sprintf("%q dead-lettered by the broker (delivery_limit)", d.MessageId))
		}
	}
}

// deathReason reports whether the x-death header holds an entry with reason.
func deathReason(headers amqp.Table, reason string) bool {
	deaths, _ := headers["x-death"].([]any)
	for _, d := range deaths {
		if t, ok := d.(amqp.Table); ok && t["reason"] == reason {
			return true
		}
	}
	return false
}
