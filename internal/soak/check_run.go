package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// gatewayStats is the payments gateway's GET /stats.
type gatewayStats struct {
	Requests      int64 `json:"requests"`
	Charges       int64 `json:"charges"`
	Distinct      int64 `json:"distinct_captures"`
	DoubleCharges int64 `json:"double_charges"`
	Replays       int64 `json:"replays"`
	KeyConflicts  int64 `json:"key_conflicts"`
	Failed        int64 `json:"injected_failures"`
	Slowed        int64 `json:"slowed"`
	Dropped       int64 `json:"dropped_after_charge"`
}

func (h *harness) checkGateway(ctx context.Context, rep *report) {
	var g gatewayStats
	if err := getJSON(ctx, h.gatewayURL+"/stats", &g); err != nil {
		rep.fail("payments", "read the gateway's /stats", err.Error())
		return
	}
	rep.Gateway = &g
	payments := 0
	for _, er := range rep.Examples {
		if er.Example == "payments" {
			payments = er.Effects
		}
	}
	rep.check("payments", "gateway double_charges == 0 and no key reused with another body", g.DoubleCharges == 0 && g.KeyConflicts == 0,
		fmt.Sprintf("double_charges %d, key_conflicts %d", g.DoubleCharges, g.KeyConflicts))
	rep.check("payments", "gateway charges == distinct captures == payment rows", g.Charges == int64(payments) && g.Distinct == int64(payments),
		fmt.Sprintf("charges %d, distinct_captures %d, payment rows %d; %d requests, %d replays", g.Charges, g.Distinct, payments, g.Requests, g.Replays))
}

// checkQueues checks that no message was left behind: the queues and retry
// queues empty with nothing unacknowledged, the orders checkpoint at the
// stream's tail.
func (h *harness) checkQueues(ctx context.Context, rep *report) {
	if qe := h.queueExamples(); len(qe) > 0 {
		qs, err := h.queueStates(ctx)
		if err != nil {
			rep.fail("queues", "list the queues", err.Error())
			return
		}
		var bad, names []string
		for _, ex := range qe {
			for _, name := range []string{h.queue(ex), h.queue(ex) + ".retry"} {
				names = append(names, name)
				s, ok := qs[name]
				switch {
				case !ok:
					bad = append(bad, name+" is gone")
				case s.Messages > 0 || s.Unacked > 0:
					bad = append(bad, fmt.Sprintf("%s holds %d messages, %d unacknowledged", name, s.Messages, s.Unacked))
				}
			}
		}
		rep.check("queues", "no message left in a queue or retry queue, none unacknowledged", len(bad) == 0,
			summarize(bad, strings.Join(names, ", ")+" empty"))
	}
	if h.cfg.runs(orders) {
		off, err := h.db.checkpoint(ctx, h.stream)
		if err != nil {
			rep.fail("queues", "read the orders checkpoint", err.Error())
			return
		}
		rep.check("queues", "the orders checkpoint is at the stream's tail", off == h.tail,
			fmt.Sprintf("checkpoint %d, tail %d", off, h.tail))
	}
}

// checkFaults checks that every enabled fault happened and was recovered
// from.
func (h *harness) checkFaults(rep *report) {
	for _, f := range h.cfg.faults {
		if f == faultGateway {
			g := rep.Gateway
			ok := g != nil && g.Failed > 0 && g.Slowed > 0 && g.Dropped > 0
			detail := "no gateway stats"
			if g != nil {
				detail = fmt.Sprintf("%d failed, %d stalled, %d dropped after charge", g.Failed, g.Slowed, g.Dropped)
			}
			rep.check("faults", "gateway failed, stalled and dropped after charge at least once each", ok, detail)
			continue
		}
		n := 0
		for _, inj := range rep.Injections {
			if inj.Fault == f && inj.Skipped == "" {
				n++
			}
		}
		rep.check("faults", fmt.Sprintf("fault %s injected at least once", f), n > 0, fmt.Sprintf("%d times", n))
	}
	var stuck []string
	for _, inj := range rep.Injections {
		if inj.Skipped == "" && inj.Recovery == 0 && !inj.Unmeasured {
			stuck = append(stuck, fmt.Sprintf("%s at %s: %s", inj.Fault, inj.At.Round(time.Millisecond), inj.Detail))
		}
	}
	rep.check("faults", "the workers recovered from every fault", len(stuck) == 0, summarize(stuck, ""))
}
