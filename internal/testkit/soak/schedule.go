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
	// faultHang publishes two liveness messages whose handlers hang: one in
	// a statement (it honours its context), one in Go code that ignores
	// its context.
	faultHang = "hang"
	// faultCrash publishes a liveness message that kills its worker
	// process (os.Exit, or a panic in a goroutine, in turn); the
	// supervisor starts the worker again each time.
	faultCrash = "crash"
	// faultCompete runs two more liveness worker processes, three in all
	// with one consumer Name on one queue, for competeFor.
	faultCompete = "compete"
	// faultRetention cleans every example's inbox at the floor (the run's
	// retention window W) with idem inbox cleanup, then goes through the
	// doors back in: a normal replay of the orders stream from first and
	// from just above the horizon, and a redrive of the queues' dead
	// letters.
	faultRetention = "retention"
)

// competeFor is how long the compete fault's extra processes run. Compete
// events are at least this far apart, so that three processes run at most.
const competeFor = 15 * time.Second

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

// schedule spreads faults over the publishing window: every enabled fault
// but retention at least once in the first half (the dispatcher fault
// first), then one every
// cfg.faultEvery on average, at random moments, until 3s before the end.
// Faults that can leave a claimed effect behind for a whole lease (the
// dispatcher fault, a kill of a worker that dispatches, a PostgreSQL
// failover under a dispatcher writing its outcomes) come only in the first
// half and early enough for the lease to end well before cfg.durationCap:
// later ones are replaced (kills hit quickstart or liveness, which dispatch
// nothing). An event too close to the previous one of its fault is
// replaced too: compete within competeFor, node within nodeEvery,
// pgfailover within failoverEvery.
//
// The retention fault cleans at the floor: it comes only once rows older
// than floor exist (floor + retentionLead after the start), at most once
// every floor, and once at least, at a random moment before the end, when
// none of the random ones was one.
func schedule(cfg config, window, floor time.Duration) []event {
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
	round := slices.DeleteFunc(slices.Clone(active), func(f string) bool { return f == faultRetention })
	r.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
	if i := slices.Index(round, faultDispatcher); i > 0 {
		round[0], round[i] = round[i], round[0]
	}
	first := window / 2
	if len(round) > 0 {
		slot := first / time.Duration(len(round))
		for i, f := range round {
			at := time.Duration(i)*slot + time.Duration(r.Int64N(int64(slot)/2)) + slot/4
			out = append(out, event{at: at, fault: f})
		}
	}
	// Then random faults until the end of the window.
	last := window - 3*time.Second
	at := first
	for {
		at += cfg.faultEvery/2 + time.Duration(r.Int64N(int64(cfg.faultEvery)))
		if at >= last {
			break
		}
		out = append(out, event{at: at, fault: active[r.IntN(len(active))]})
	}
	earliest := floor + retentionLead
	// spacing is how far apart two events of a fault must be, last when
	// each fault came last (out is in time order).
	spacing := map[string]time.Duration{faultCompete: competeFor, faultRetention: floor, faultNode: nodeEvery, faultFreeze: nodeEvery, faultPGFailover: failoverEvery}
	lastAt := map[string]time.Duration{}
	for i := range out {
		e := &out[i]
		late := e.at > stranding
		var not []string
		if late {
			not = append(not, faultDispatcher, faultPGFailover)
		}
		if e.at < earliest {
			not = append(not, faultRetention)
		}
		for f, gap := range spacing {
			if t, ok := lastAt[f]; ok && e.at-t < gap {
				not = append(not, f)
			}
		}
		if slices.Contains(not, e.fault) {
			e.fault = pickOther(r, active, not...)
		}
		lastAt[e.fault] = e.at
		if e.fault == faultKill {
			e.target = killTarget(r, cfg.examples, late)
		}
	}
	out = slices.DeleteFunc(out, func(e event) bool { return e.fault == "" || e.target < 0 })
	if _, retaining := lastAt[faultRetention]; slices.Contains(active, faultRetention) && !retaining && last > earliest {
		at := earliest + time.Duration(r.Int64N(int64(last-earliest)))
		i := slices.IndexFunc(out, func(e event) bool { return e.at > at })
		if i < 0 {
			i = len(out)
		}
		out = slices.Insert(out, i, event{at: at, fault: faultRetention})
	}
	return out
}

// pickOther picks a fault from active other than those in not, or "" if
// none.
func pickOther(r *rand.Rand, active []string, not ...string) string {
	var others []string
	for _, f := range active {
		if !slices.Contains(not, f) {
			others = append(others, f)
		}
	}
	if len(others) == 0 {
		return ""
	}
	return others[r.IntN(len(others))]
}

// killTarget picks the worker to kill; late in the run only one that runs
// no dispatcher (quickstart, liveness), or -1 if there is none.
func killTarget(r *rand.Rand, examples []example, late bool) example {
	if !late {
		return examples[r.IntN(len(examples))]
	}
	safe := slices.DeleteFunc(slices.Clone(examples), func(ex example) bool { return ex != quickstart && ex != liveness })
	if len(safe) == 0 {
		return -1
	}
	return safe[r.IntN(len(safe))]
}
