package main

import (
	"math/rand/v2"
	"slices"
	"time"
)

// Faults.
const (
	// faultKill SIGKILLs a worker process and starts it again.
	faultKill = "kill"
	// faultConnections closes every broker connection of the run's workers.
	faultConnections = "connections"
	// faultBackends terminates every PostgreSQL session of the run's workers.
	faultBackends = "backends"
	// faultDispatcher SIGKILLs the payments worker while its ledger
	// dispatcher has gateway calls in flight.
	faultDispatcher = "dispatcher"
	// faultGateway makes the fake gateway fail, stall and charge-then-drop
	// a share of the capture requests, for the whole run.
	faultGateway = "gateway"
)

// dispatcherLease is the lease of a claimed ledger effect in the examples'
// workers (ledger.DispatcherConfig.Lease's default, which the workers do not
// expose): an effect whose worker was killed mid-call is due again only
// after it. A fault that can strand a claim is never scheduled so late that
// its lease would end after the run's cap.
const dispatcherLease = time.Minute

// event is one scheduled fault.
type event struct {
	at     time.Duration // after publishing started
	fault  string
	target example // faultKill: the worker to kill
}

// schedule spreads faults over the publishing window: every enabled fault at
// least once in the first half (the dispatcher fault first), then one every
// cfg.faultEvery on average, at random moments, until 3s before the end.
// Faults that can leave a claimed effect behind for a whole lease (the
// dispatcher fault, a kill of a worker that dispatches) come only in the
// first half and early enough for the lease to end well before
// cfg.durationCap: later ones are replaced (kills hit quickstart, which
// dispatches nothing).
func schedule(cfg config, window time.Duration) []event {
	r := rand.New(rand.NewPCG(cfg.seed, 0x6661756c74))
	var active []string
	for _, f := range cfg.faults {
		if f != faultGateway { // the gateway's faults are per request, all run long
			active = append(active, f)
		}
	}
	if len(active) == 0 || window <= 0 {
		return nil
	}
	stranding := min(window/2, cfg.durationCap-dispatcherLease-30*time.Second)
	var out []event
	// First round: a random order, the dispatcher first, in the first half.
	r.Shuffle(len(active), func(i, j int) { active[i], active[j] = active[j], active[i] })
	if i := slices.Index(active, faultDispatcher); i > 0 {
		active[0], active[i] = active[i], active[0]
	}
	first := window / 2
	slot := first / time.Duration(len(active))
	for i, f := range active {
		at := time.Duration(i)*slot + time.Duration(r.Int64N(int64(slot)/2)) + slot/4
		out = append(out, event{at: at, fault: f})
	}
	// Then random faults until the end of the window.
	at := first
	for {
		at += cfg.faultEvery/2 + time.Duration(r.Int64N(int64(cfg.faultEvery)))
		if at >= window-3*time.Second {
			break
		}
		out = append(out, event{at: at, fault: active[r.IntN(len(active))]})
	}
	for i := range out {
		e := &out[i]
		late := e.at > stranding
		if e.fault == faultDispatcher && late {
			e.fault = pickOther(r, active, faultDispatcher)
		}
		if e.fault == faultKill {
			e.target = killTarget(r, cfg.examples, late)
		}
	}
	return slices.DeleteFunc(out, func(e event) bool { return e.fault == "" || e.target < 0 })
}

// pickOther picks a fault from active other than not, or "" if none.
func pickOther(r *rand.Rand, active []string, not string) string {
	var others []string
	for _, f := range active {
		if f != not {
			others = append(others, f)
		}
	}
	if len(others) == 0 {
		return ""
	}
	return others[r.IntN(len(others))]
}

// killTarget picks the worker to kill; late in the run only one that runs
// no dispatcher (quickstart), or -1 if there is none.
func killTarget(r *rand.Rand, examples []example, late bool) example {
	if !late {
		return examples[r.IntN(len(examples))]
	}
	if slices.Contains(examples, quickstart) {
		return quickstart
	}
	return -1
}
