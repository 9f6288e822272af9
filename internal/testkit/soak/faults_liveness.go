package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/soak/soakworker"
)

// competeExtra is how many processes the compete fault adds to the liveness
// worker: three run at once.
const competeExtra = 2

// competeStopGrace is how long a competing process may take to stop on
// SIGTERM: the worker's ShutdownTimeout (30s by default) and a little more.
const competeStopGrace = 35 * time.Second

// hang publishes two liveness messages whose handlers hang, one in a
// statement, one ignoring its context. They must end in the dead letters
// as handler_timeout; recovery is the time until a message published after
// them was processed: the worker never waits for a hung handler.
func (in *injector) hang(ctx context.Context, inj *injection) error {
	inj.Target = liveness.String()
	ids, err := in.publishFaulty(ctx, []string{soakworker.FaultHangSQL, soakworker.FaultHangGo}, deadletters.ReasonHandlerTimeout)
	if err != nil {
		return err
	}
	t0 := time.Now()
	inj.Detail = fmt.Sprintf("published %s (pg_sleep) and %s (sleep ignoring its context)", shortID(ids[0]), shortID(ids[1]))
	in.watch(ctx, inj, t0, []example{liveness})
	in.wg.Go(func() { in.awaitDeadLetters(ctx, inj, ids, t0) })
	return nil
}

// crash publishes a liveness message that kills its worker, by os.Exit and
// by a panic in a goroutine in turn (the seed picks the first). It must end
// in the dead letters as worker_crashed, and nothing else with it; recovery
// is the time until it is dead-lettered and a message published after it
// was processed.
func (in *injector) crash(ctx context.Context, inj *injection) error {
	inj.Target = liveness.String()
	fault := soakworker.FaultCrashExit
	if (in.h.cfg.seed+uint64(in.crashes))%2 == 1 {
		fault = soakworker.FaultCrashPanic
	}
	ids, err := in.publishFaulty(ctx, []string{fault}, deadletters.ReasonWorkerCrashed)
	if err != nil {
		return err
	}
	in.crashes++
	t0 := time.Now()
	inj.Detail = fmt.Sprintf("published %s (%s)", shortID(ids[0]), fault)
	in.watch(ctx, inj, t0, []example{liveness}, func(ctx context.Context) (time.Duration, bool) {
		return in.awaitDeadLetters(ctx, inj, ids, t0)
	})
	return nil
}

// compete starts competeExtra more liveness processes, and stops them with
// SIGTERM competeFor later (or leaves them to the end of the run). Recovery
// is the time until a message published after they started was processed.
func (in *injector) compete(ctx context.Context, inj *injection) error {
	h := in.h
	inj.Target = liveness.String()
	pgURL, err := withAppName(h.cfg.pgURL, h.appName(liveness))
	if err != nil {
		return err
	}
	in.competes++
	var started []*proc
	for j := range competeExtra {
		p := h.livenessProc(fmt.Sprintf("%s-c%d-%d", liveness, in.competes, j+1), pgURL)
		if err := h.sup.start(p); err != nil {
			for _, q := range started {
				q.stop(competeStopGrace)
			}
			return err
		}
		started = append(started, p)
	}
	h.extrasMu.Lock()
	h.extras = append(h.extras, started...)
	h.extrasMu.Unlock()
	t0 := time.Now()
	var tags []string
	for _, p := range started {
		tags = append(tags, p.name)
		inj.Processes = append(inj.Processes, p.name)
	}
	inj.Detail = fmt.Sprintf("%s started beside %s for %s: 3 processes, one consumer", strings.Join(tags, ", "), liveness, competeFor)
	in.watch(ctx, inj, t0, []example{liveness})
	in.wg.Go(func() {
		select {
		case <-ctx.Done():
			return // the supervisor stops them with the run
		case <-time.After(competeFor):
		}
		for _, p := range started {
			p.stop(competeStopGrace)
		}
		in.mu.Lock()
		inj.Outcome = fmt.Sprintf("stopped with SIGTERM after %s", time.Since(t0).Round(time.Second))
		in.mu.Unlock()
	})
	return nil
}

// publishFaulty publishes one liveness message per fault, each expected in
// the dead letters with reason, and returns their ids.
func (in *injector) publishFaulty(ctx context.Context, faults []string, reason string) ([]string, error) {
	var ids []string
	for _, f := range faults {
		in.faulty++
		id := fmt.Sprintf("%s-%s-%d", in.h.pub.plan.run, strings.ReplaceAll(f, "_", "-"), in.faulty)
		body := soakworker.Body("L1", int64(in.faulty), f)
		if err := in.h.publishOne(ctx, in.h.queue(liveness), id, body); err != nil {
			return ids, err
		}
		ids = append(ids, id)
		in.mu.Lock()
		in.faultyDead = append(in.faultyDead, deadLetter{id: id, hash: hashOf(body), reason: reason})
		in.mu.Unlock()
	}
	return ids, nil
}

// awaitDeadLetters waits until every message of ids has a dead-letter row
// and notes, in inj.Outcome, how long that took and with which reasons (and,
// for poison messages, how many worker deaths it took). It returns the time
// since t0.
func (in *injector) awaitDeadLetters(ctx context.Context, inj *injection, ids []string, t0 time.Time) (time.Duration, bool) {
	var reasons map[string]string
	d, ok := poll(ctx, 50*time.Millisecond, t0, func() (bool, error) {
		var err error
		reasons, err = in.h.db.deadLettered(ctx, liveness, ids)
		return len(reasons) == len(ids), err
	})
	if !ok {
		return 0, false
	}
	var parts []string
	for _, id := range ids {
		part := reasons[id]
		if n := in.crashesOf(id); n > 0 {
			part += fmt.Sprintf(" after %d worker deaths", n)
		}
		parts = append(parts, part)
	}
	slices.Sort(parts)
	parts = slices.Compact(parts)
	in.mu.Lock()
	inj.Outcome = fmt.Sprintf("dead-lettered as %s in %s", strings.Join(parts, ", "), dur(d))
	in.mu.Unlock()
	return d, true
}

// crashesOf counts the worker deaths poison message id caused.
func (in *injector) crashesOf(id string) int {
	n := 0
	for _, c := range in.h.sup.crashes() {
		if c == id {
			n++
		}
	}
	return n
}

// shortID is a soak message id without the run's prefix.
func shortID(id string) string {
	if _, rest, ok := strings.Cut(id, "-"); ok {
		return rest
	}
	return id
}
