package main

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/bench/path/pathtrace"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/retry"
)

// pollEvery is how often a round reads Stats.
const pollEvery = time.Millisecond

// recording is what the rounds of one source recorded: the calls of each
// message round (one new message each) and of each control round (as long
// as the message round before it, no message).
type recording struct {
	Messages [][]pathtrace.Event `json:"messages"`
	Controls [][]pathtrace.Event `json:"controls"`
}

// measure lets the warm-up messages through, then runs the message rounds,
// each followed by its control round, and returns what they recorded.
func (r *rig) measure(ctx context.Context) (recording, error) {
	var rec recording
	for i := range r.o.warmups {
		if err := r.publish(ctx, fmt.Sprintf("bench-path-%s-warmup-%d", r.runID, i)); err != nil {
			return rec, err
		}
		if err := r.awaitProcessed(ctx, int64(i+1)); err != nil {
			return rec, fmt.Errorf("warm-up %d: %w", i, err)
		}
	}
	for round := 1; round <= r.o.rounds; round++ {
		msg, took, err := r.messageRound(ctx, round)
		if err != nil {
			return rec, fmt.Errorf("%s round %d: %w", r.source, round, err)
		}
		ctl, err := r.controlRound(ctx, took)
		if err != nil {
			return rec, fmt.Errorf("%s control round %d: %w", r.source, round, err)
		}
		rec.Messages, rec.Controls = append(rec.Messages, msg), append(rec.Controls, ctl)
		logf("%s round %d: the message was counted %s after publishing (%d calls recorded, %d in its control round)",
			r.source, round, took.Round(time.Microsecond), len(msg), len(ctl))
	}
	return rec, nil
}

// messageRound starts a recording, publishes one new message, waits until
// Stats count it as processed (after its ack or its checkpoint), waits the
// grace period and stops the recording. It returns the calls and how long
// the message took from publishing to being counted.
func (r *rig) messageRound(ctx context.Context, round int) ([]pathtrace.Event, time.Duration, error) {
	if err := sleep(ctx, r.o.quiet); err != nil {
		return nil, 0, err
	}
	want := int64(r.o.warmups + round)
	pathtrace.Start()
	start := time.Now()
	err := r.publish(ctx, fmt.Sprintf("bench-path-%s-msg-%d", r.runID, round))
	if err == nil {
		err = r.awaitProcessed(ctx, want)
	}
	took := time.Since(start)
	if err == nil {
		err = sleep(ctx, r.o.grace)
	}
	events, dropped := pathtrace.Stop()
	switch {
	case err != nil:
		return nil, 0, err
	case dropped > 0:
		return nil, 0, fmt.Errorf("the recording dropped %d calls beyond its bound", dropped)
	case len(events) == 0:
		return nil, 0, fmt.Errorf("no call recorded: not an instrumented build (%s)", buildHint)
	}
	if st := r.c.Stats(); st.Processed != want || st.Duplicates+st.DeadLettered+st.Retried+st.Unresolved != 0 {
		return nil, 0, fmt.Errorf("the message left the success path: %+v", st)
	}
	return events, took, nil
}

// controlRound records for d, polling Stats as a message round does, with
// no message, then waits the grace period.
func (r *rig) controlRound(ctx context.Context, d time.Duration) ([]pathtrace.Event, error) {
	if err := sleep(ctx, r.o.quiet); err != nil {
		return nil, err
	}
	pathtrace.Start()
	_, err := r.poll(ctx, d, nil)
	if err == nil {
		err = sleep(ctx, r.o.grace)
	}
	events, dropped := pathtrace.Stop()
	switch {
	case err != nil:
		return nil, err
	case dropped > 0:
		return nil, fmt.Errorf("the recording dropped %d calls beyond its bound", dropped)
	}
	return events, nil
}

// awaitProcessed polls Stats until n messages were processed, for at most
// the -timeout.
func (r *rig) awaitProcessed(ctx context.Context, n int64) error {
	done, err := r.poll(ctx, r.o.timeout, func(s consumer.Stats) bool { return s.Processed >= n })
	if err != nil {
		return err
	}
	if !done {
		return fmt.Errorf("%d messages not processed within %s (stats %+v)", n, r.o.timeout, r.c.Stats())
	}
	return nil
}

// poll reads Stats every pollEvery until cond holds (it returns true) or d
// has passed (false). With a nil cond it polls for d: a control round's
// polling is then the same as a message round's.
func (r *rig) poll(ctx context.Context, d time.Duration, cond func(consumer.Stats) bool) (bool, error) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		s := r.c.Stats()
		if cond != nil && cond(s) {
			return true, nil
		}
		if err := sleep(ctx, pollEvery); err != nil {
			return false, err
		}
	}
	return false, nil
}

// sleep waits for d or until ctx is done, and returns ctx's error then.
func sleep(ctx context.Context, d time.Duration) error {
	if !retry.Sleep(ctx, d) {
		return ctx.Err()
	}
	return nil
}
