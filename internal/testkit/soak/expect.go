package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"time"
)

// expectation is what an example's tables must hold after the run, derived
// from what was published. Which copy of a conflicting pair is processed
// depends on arrival order (on a queue); the inbox says which one was, and
// the expectation follows it: the other copy must then be the dead letter.
type expectation struct {
	// effective is the processed message per inbox id: the plan index of
	// the copy whose payload hash the inbox holds.
	effective map[string]int
	// dead are the dead letters the run must produce.
	dead []deadLetter
	// problems are contradictions found on the way (a missing inbox row, a
	// hash that matches no published copy, a stream conflict won by the
	// later copy).
	problems []string
}

// expect computes the expectation of ex from the plan and the example's
// inbox. winnerOf (payments) names the message id whose capture request
// holds the payment row, for capture request conflicts.
func expect(p plan, ex example, inbox map[string][32]byte, winnerOf map[string]string) expectation {
	e := expectation{effective: map[string]int{}}
	candidates := map[string][]int{} // inbox id → plan indexes of its distinct payloads
	for i, m := range p.msgs {
		if m.ex != ex {
			continue
		}
		switch m.kind {
		case kindValid, kindConflict:
			candidates[m.id] = append(candidates[m.id], i)
		case kindRetry:
			candidates[m.id] = []int{i}
		case kindMalformed:
			e.dead = append(e.dead, deadLetter{id: m.id, hash: m.hash, reason: m.reason})
		}
	}
	// Capture request conflicts: two ids, one capture request; the payment
	// row says which id won, the other is dead-lettered.
	for i, m := range p.msgs {
		if m.ex != ex || m.kind != kindCaptureConflict {
			continue
		}
		orig := p.msgs[m.of]
		winner, loser := i, m.of
		if winnerOf[m.key] != m.id {
			winner, loser = m.of, i
		}
		if winnerOf[m.key] != m.id && winnerOf[m.key] != orig.id {
			e.problems = append(e.problems, fmt.Sprintf("capture request %s: payment row from message %q, published as %q or %q",
				m.key, winnerOf[m.key], orig.id, m.id))
		}
		delete(candidates, p.msgs[loser].id)
		candidates[p.msgs[winner].id] = []int{winner}
		e.dead = append(e.dead, deadLetter{id: p.msgs[loser].id, hash: p.msgs[loser].hash, reason: "capture_request_conflict"})
	}
	for id, idx := range candidates {
		h, ok := inbox[id]
		if !ok {
			e.problems = append(e.problems, fmt.Sprintf("message %s was never processed (no inbox row)", id))
			continue
		}
		found := -1
		for _, i := range idx {
			if p.msgs[i].hash == h {
				found = i
			}
		}
		if found < 0 {
			e.problems = append(e.problems, fmt.Sprintf("message %s: the inbox holds a payload hash no published copy has", id))
			continue
		}
		e.effective[id] = found
		for _, i := range idx {
			if i != found {
				e.dead = append(e.dead, deadLetter{id: id, hash: p.msgs[i].hash, reason: "payload_conflict"})
			}
		}
		if ex == orders && p.msgs[found].kind == kindConflict {
			e.problems = append(e.problems, fmt.Sprintf("stream message %s: the later copy was processed, not the first", id))
		}
	}
	for id := range inbox {
		if _, ok := candidates[id]; !ok {
			e.problems = append(e.problems, fmt.Sprintf("inbox row for message %q, which must not have been processed", id))
		}
	}
	sort.Strings(e.problems)
	return e
}

// balances is what quickstart's balances must be: per account, the sum of
// the processed deposits.
func (e expectation) balances(p plan) map[string]int64 {
	out := map[string]int64{}
	for _, i := range e.effective {
		var d struct {
			Account string `json:"account"`
			Amount  int64  `json:"amount"`
		}
		_ = json.Unmarshal(p.msgs[i].body, &d)
		out[d.Account] += d.Amount
	}
	return out
}

// capture is a payments row, or what it must be.
type capture struct {
	Order    string `json:"orderId"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// captures is what the payments table must hold: per captureRequestId, the
// order, amount and currency of the processed message.
func (e expectation) captures(p plan) map[string]capture {
	out := map[string]capture{}
	for _, i := range e.effective {
		var c capture
		_ = json.Unmarshal(p.msgs[i].body, &c)
		out[p.msgs[i].key] = c
	}
	return out
}

// overviewRow is an order_overview row, or what it must be.
type overviewRow struct {
	Status    string
	Version   int
	UpdatedAt time.Time
}

var statuses = map[string]string{"OrderPlaced": "placed", "OrderPaid": "paid", "OrderShipped": "shipped"}

// overview is the orders projection under the example's version policy: per
// order, the processed event with the highest version (a stale event is a
// no-op, a gap is applied), with its creation time.
func (e expectation) overview(p plan, sentAt []time.Time) (map[string]overviewRow, map[string]bool) {
	out := map[string]overviewRow{}
	shipped := map[string]bool{}
	for _, i := range e.effective {
		var ev orderEvent
		_ = json.Unmarshal(p.msgs[i].body, &ev)
		if ev.Type == "OrderShipped" {
			shipped[ev.OrderID] = true
		}
		if cur, ok := out[ev.OrderID]; ok && cur.Version >= ev.Version {
			continue
		}
		out[ev.OrderID] = overviewRow{Status: statuses[ev.Type], Version: ev.Version, UpdatedAt: sentAt[i]}
	}
	return out, shipped
}
