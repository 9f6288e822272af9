package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/deadletters"
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
	if h.cfg.has(faultCompete) {
		h.checkCompete(rep)
	}
	var stuck []string
	for _, inj := range rep.Injections {
		if inj.Skipped == "" && inj.Recovery == 0 && !inj.Unmeasured {
			stuck = append(stuck, fmt.Sprintf("%s at %s: %s", inj.Fault, inj.At.Round(time.Millisecond), inj.Detail))
		}
	}
	rep.check("faults", "the workers recovered from every fault", len(stuck) == 0, summarize(stuck, ""))
	if slices.ContainsFunc(h.cfg.faults, isClusterFault) {
		var broken []string
		restored := 0
		for _, inj := range rep.Injections {
			switch {
			case inj.Unrestored != "":
				broken = append(broken, fmt.Sprintf("%s at %s: %s", inj.Fault, inj.At.Round(time.Millisecond), inj.Unrestored))
			case isClusterFault(inj.Fault) && inj.Skipped == "":
				restored++
			}
		}
		rep.check("faults", "every node killed ran again, every node frozen was thawed, every primary stopped came back as a synchronous standby", len(broken) == 0,
			summarize(broken, fmt.Sprintf("%d put back", restored)))
	}
}

// checkCompete checks that every process the compete fault added applied
// messages: three processes really competed for the queue.
func (h *harness) checkCompete(rep *report) {
	var idle, busy []string
	for _, inj := range rep.Injections {
		for _, p := range inj.Processes {
			if n := rep.AppliedBy[p]; n > 0 {
				busy = append(busy, fmt.Sprintf("%s %d", p, n))
			} else {
				idle = append(idle, p+" applied nothing")
			}
		}
	}
	rep.check("faults", "every competing liveness process applied messages", len(idle) == 0 && len(busy) > 0,
		summarize(idle, fmt.Sprintf("%s; liveness %d", cmp.Or(strings.Join(busy, ", "), "no competing process"), rep.AppliedBy[liveness.String()])))
}

// livenessMaxCrashes is the liveness worker's consumer.Config.MaxCrashes
// (the default, which the worker does not set): a poison message runs at
// most once in a batch and MaxCrashes times alone before idem dead-letters
// it without running it again.
const livenessMaxCrashes = 3

// checkCrashes checks that every poison message killed its worker, and at
// most 1 + livenessMaxCrashes times: a supervisor restarts a worker a
// bounded number of times per poison message.
func (h *harness) checkCrashes(rep *report, faulty []deadLetter) {
	if !h.cfg.has(faultCrash) {
		return
	}
	deaths := map[string]int{}
	for _, id := range h.sup.crashes() {
		deaths[id]++
	}
	var bad, seen []string
	for _, d := range faulty {
		if d.reason != deadletters.ReasonWorkerCrashed {
			continue
		}
		n := deaths[d.id]
		seen = append(seen, fmt.Sprint(n))
		if n < 1 || n > 1+livenessMaxCrashes {
			bad = append(bad, fmt.Sprintf("%s: %d worker deaths", shortID(d.id), n))
		}
		delete(deaths, d.id)
	}
	for id, n := range deaths {
		bad = append(bad, fmt.Sprintf("%s: %d worker deaths, and no crash fault published it", id, n))
	}
	rep.Crashes = len(h.sup.crashes())
	rep.check("faults", fmt.Sprintf("every poison message killed its worker, at most %d times (1 + MaxCrashes)", 1+livenessMaxCrashes),
		len(bad) == 0 && len(seen) > 0, summarize(bad, "worker deaths per poison message: "+cmp.Or(strings.Join(seen, ", "), "no poison message")))
}

// checkHangs checks that every hung message was dead-lettered after its
// attempts: retried once its handler timed out, until MaxAttempts.
func (h *harness) checkHangs(ctx context.Context, rep *report, faulty []deadLetter) {
	if !h.cfg.has(faultHang) {
		return
	}
	var ids []string
	for _, d := range faulty {
		if d.reason == deadletters.ReasonHandlerTimeout {
			ids = append(ids, d.id)
		}
	}
	attempts, err := h.db.deadLetterAttempts(ctx, liveness, ids)
	if err != nil {
		rep.fail("faults", "read the hung messages' dead letters", err.Error())
		return
	}
	var bad []string
	for _, id := range ids {
		for _, n := range attempts[id] {
			if n != livenessMaxAttempts {
				bad = append(bad, fmt.Sprintf("%s: dead-lettered after %d attempts", shortID(id), n))
			}
		}
	}
	rep.check("faults", fmt.Sprintf("every hung message dead-lettered after its %d attempts (MaxAttempts)", livenessMaxAttempts),
		len(bad) == 0 && len(ids) > 0, summarize(bad, fmt.Sprintf("%d hung messages", len(ids))))
}
