package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/retry"
)

// Run cleans shortly after it starts (within cfg.Jitter) and then every
// cfg.Interval (plus up to cfg.Jitter at random) until ctx ends, then
// returns nil. It is meant to run beside a worker's consumer:
//
//	go retention.Run(ctx, retention.Config{Pool: pool, OlderThan: 30 * 24 * time.Hour})
//
// Any number of processes may run it: a round first takes a PostgreSQL
// advisory lock for cfg.Tables without waiting, and a process that finds it
// held skips the round, so one cleanup runs at a time across processes. A
// round is bounded by cfg.RoundTimeout; a failed round is logged and the
// next one runs as scheduled. Run returns an error at once, without
// cleaning, when cfg is invalid (ErrInvalidConfig, ErrBelowFloor).
//
// When it starts, Run sets the gauge idem.retention.interval to
// cfg.Interval and idem.retention.last_success.timestamp to the time it
// started (nothing has failed yet); each round that goes through sets the
// latter again. An alert on a last success older than twice the interval
// (docs/prometheus/idem-alerts.yml) finds a retention that stopped.
func Run(ctx context.Context, cfg Config) error {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	m, err := newMetrics(cfg.MeterProvider)
	if err != nil {
		return fmt.Errorf("retention: metrics: %w", err)
	}
	m.interval.Record(ctx, cfg.Interval.Seconds())
	m.succeeded(time.Now())
	log := cfg.Logger.With(slog.String("schema", cfg.Tables.Schema))
	wait := retry.Jitter(cfg.Jitter) // a worker restarted often still cleans
	for {
		if !retry.Sleep(ctx, wait) {
			return nil
		}
		res, ran, err := round(ctx, cfg)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			log.Error("retention: round failed; the next round goes on", "error", err, "deleted", res.Total())
		case !ran:
			log.Debug("retention: another process is cleaning; skipping this round")
		default:
			log.Info("retention: cleaned", countAttrs(res)...)
		}
		wait = cfg.Interval + retry.Jitter(cfg.Jitter)
	}
}

// lockKey is the advisory lock key of the retention of t.
func lockKey(t idem.Tables) string { return "retention\x00" + t.Schema + "\x00" + t.Prefix }

// round runs one Clean under the retention lock; ran is false when another
// session held the lock.
func round(ctx context.Context, cfg Config) (res Result, ran bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.RoundTimeout)
	defer cancel()
	lock, err := pglock.TryAcquire(ctx, cfg.Pool, lockKey(cfg.Tables), pglock.Config{Logger: discard})
	if errors.Is(err, pglock.ErrHeld) {
		return Result{}, false, nil
	}
	if err != nil {
		return Result{}, false, err
	}
	defer func() {
		relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rerr := lock.Release(relCtx); rerr != nil && err == nil {
			cfg.Logger.Warn("retention: release the lock", "error", rerr)
		}
	}()
	go func() { // owned: ends with the round's context, cancelled on return
		select {
		case <-lock.Lost():
			cancel()
		case <-ctx.Done():
		}
	}()
	res, err = Clean(ctx, cfg)
	return res, true, err
}

// discard drops the lock's own logs: Run logs what matters once per round.
var discard = slog.New(slog.DiscardHandler)

func countAttrs(res Result) []any {
	attrs := []any{slog.Time("cutoff", res.Cutoff)}
	for _, c := range res.Counts {
		attrs = append(attrs, slog.Int64(c.Table, c.Deleted))
	}
	return attrs
}
