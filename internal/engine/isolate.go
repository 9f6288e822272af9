package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/retry"
)

// RunAlone runs one suspect item — a delivery the broker made before, whose
// worker may have died on it — with no other batch of this engine running,
// so that if it kills the process again it takes only itself down. Before
// its handler runs, a start is counted in the attempts table and committed;
// the transaction that settles the item clears it. A start still counted
// when the item comes back is a worker that died while it ran alone: after
// MaxCrashes of them the item is dead-lettered as worker_crashed, without
// running, before the broker's delivery limit would drop it. A healthy item
// never accumulates starts: its own transaction clears them.
func (e *Engine) RunAlone(ctx context.Context, it *Item, q Queue) Result {
	p := q.rules(e)
	release, ok := e.gov.exclusive(ctx, p.abandon)
	if !ok {
		return Result{Outcome: idem.Unresolved, Err: context.Cause(ctx)}
	}
	defer release()
	e.Vitals.started() // marking is watched like an attempt
	defer e.Vitals.left()
	scope := p.scope
	fixed := make([]Result, 1)
	marked := false
	if it.Reject == nil && it.ID != "" && p.inbox != inboxLook {
		crashes, err := e.markStartUntilAnswered(ctx, scope, it, &p)
		if err != nil {
			e.cfg.Logger.Warn("could not mark a suspect message before running it alone; leaving it for redelivery",
				"message_id", shortID(it.ID), "error", err)
			return Result{Outcome: idem.Unresolved, Err: err}
		}
		marked = true
		if died := crashes - 1; died >= e.cfg.MaxCrashes {
			fixed[0] = Result{Outcome: idem.DeadLettered, Reason: deadletters.ReasonWorkerCrashed,
				Err: fmt.Errorf("its worker died %d times while it ran alone (limit %d)", died, e.cfg.MaxCrashes)}
			e.cfg.Logger.Error("poison message: its worker died each time it ran; dead-lettering it",
				"message_id", shortID(it.ID), "crashes", died)
		}
	}
	res := e.run(ctx, []*Item{it}, &p, fixed, true)
	if marked && res[0].Outcome == idem.Unresolved {
		e.unmarkStart(ctx, scope, it) // the worker lives: this start was no crash
	}
	return res[0]
}

// markStartUntilAnswered is markStart, retried with capped backoff while
// the database does not answer, as a batch is (see Engine.Run): handing
// the message back at once would have the broker deliver it again within
// milliseconds, and a quorum queue dead-letters a message delivered
// DeliveryLimit times (reason delivery_limit, without a row) long before
// an outage of seconds ends. It gives up when ctx ends, when the session
// is abandoned (its messages are redelivered anyway), or when the
// database answers and marking still fails BatchRetries times.
func (e *Engine) markStartUntilAnswered(ctx context.Context, scope string, it *Item, p *rules) (int, error) {
	for attempt := 1; ; attempt++ {
		crashes, err := e.markStart(ctx, scope, it)
		if err == nil {
			return crashes, nil
		}
		if ctx.Err() != nil || closed(p.abandon) || attempt >= e.cfg.BatchRetries && e.databaseAnswers(ctx) {
			return 0, err
		}
		delay := retry.Backoff(attempt, 50*time.Millisecond, 5*time.Second)
		e.cfg.Logger.Warn("could not mark a suspect message before running it alone; retrying",
			"message_id", shortID(it.ID), "attempt", attempt, "retry_in", delay, "error", err)
		sleepUnlessAbandoned(ctx, delay, p.abandon)
	}
}
