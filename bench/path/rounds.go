package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/coverage"
	"time"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/retry"
)

// pollEvery is how often a round reads Stats.
const pollEvery = time.Millisecond

// snapshots are the counter directories of the rounds, one per round.
type snapshots struct {
	messages []string // one new message each
	controls []string // as long as the message round before, no message
}

// measure lets the warm-up messages through, then runs the message rounds,
// each followed by its control round, and returns their counter snapshots,
// written under dir.
func (r *rig) measure(ctx context.Context, dir string) (snapshots, error) {
	var s snapshots
	for i := range r.o.warmups {
		if err := r.publish(ctx, fmt.Sprintf("bench-path-%s-warmup-%d", r.runID, i)); err != nil {
			return s, err
		}
		if err := r.awaitProcessed(ctx, int64(i+1)); err != nil {
			return s, fmt.Errorf("warm-up %d: %w", i, err)
		}
	}
	for round := 1; round <= r.o.rounds; round++ {
		msg, took, err := r.messageRound(ctx, dir, round)
		if err != nil {
			return s, fmt.Errorf("round %d: %w", round, err)
		}
		ctl, err := r.controlRound(ctx, dir, round, took)
		if err != nil {
			return s, fmt.Errorf("control round %d: %w", round, err)
		}
		s.messages, s.controls = append(s.messages, msg), append(s.controls, ctl)
		logf("round %d: the message was counted %s after publishing", round, took.Round(time.Microsecond))
	}
	return s, nil
}

// messageRound clears the counters, publishes one new message, waits until
// Stats count it as processed (after its ack), waits the grace period and
// writes the counters. It returns their directory and how long the message
// took from publishing to being counted.
func (r *rig) messageRound(ctx context.Context, dir string, round int) (string, time.Duration, error) {
	if err := sleep(ctx, r.o.quiet); err != nil {
		return "", 0, err
	}
	want := int64(r.o.warmups + round)
	if err := coverage.ClearCounters(); err != nil {
		return "", 0, fmt.Errorf("clear coverage counters: %w", err)
	}
	start := time.Now()
	if err := r.publish(ctx, fmt.Sprintf("bench-path-%s-msg-%d", r.runID, round)); err != nil {
		return "", 0, err
	}
	if err := r.awaitProcessed(ctx, want); err != nil {
		return "", 0, err
	}
	took := time.Since(start)
	if err := sleep(ctx, r.o.grace); err != nil {
		return "", 0, err
	}
	snap, err := writeCounters(dir, fmt.Sprintf("msg-%d", round))
	if err != nil {
		return "", 0, err
	}
	if st := r.c.Stats(); st.Processed != want || st.Duplicates+st.DeadLettered+st.Retried+st.Unresolved != 0 {
		return "", 0, fmt.Errorf("the message left the success path: %+v", st)
	}
	return snap, took, nil
}

// controlRound clears the counters, polls Stats for d as a message round
// does, with no message, waits the grace period and writes the counters.
func (r *rig) controlRound(ctx context.Context, dir string, round int, d time.Duration) (string, error) {
	if err := sleep(ctx, r.o.quiet); err != nil {
		return "", err
	}
	if err := coverage.ClearCounters(); err != nil {
		return "", fmt.Errorf("clear coverage counters: %w", err)
	}
	if _, err := r.poll(ctx, d, nil); err != nil {
		return "", err
	}
	if err := sleep(ctx, r.o.grace); err != nil {
		return "", err
	}
	return writeCounters(dir, fmt.Sprintf("ctl-%d", round))
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

// writeCounters writes the coverage counters, and the meta-data go tool
// covdata needs beside them, to dir/name and returns that directory.
func writeCounters(dir, name string) (string, error) {
	snap := filepath.Join(dir, name)
	if err := os.MkdirAll(snap, 0o755); err != nil {
		return "", fmt.Errorf("counter directory: %w", err)
	}
	if err := coverage.WriteCountersDir(snap); err != nil {
		return "", fmt.Errorf("write coverage counters to %s: %w", snap, err)
	}
	if err := coverage.WriteMetaDir(snap); err != nil {
		return "", fmt.Errorf("write coverage meta-data to %s: %w", snap, err)
	}
	return snap, nil
}

// sleep waits for d or until ctx is done, and returns ctx's error then.
func sleep(ctx context.Context, d time.Duration) error {
	if !retry.Sleep(ctx, d) {
		return ctx.Err()
	}
	return nil
}
