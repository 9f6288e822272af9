//go:build cluster

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/internal/testkit/testcluster"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
	"github.com/idemkit/idem/pgnodes"
)

// freezeTarget is the longest time without a deposit applied, from the end
// of the standby's promotion on, that a frozen primary may cost.
const freezeTarget = 10 * time.Second

// A PostgreSQL primary frozen (SIGSTOP: its port still accepts connections,
// nothing answers) while a quickstart worker applies deposits through the
// pair's multi-host URL, then its synchronous standby promoted 6 s later
// (a failover manager's detection time), or at once: the worker applies
// deposits again within freezeTarget of the promotion, every deposit
// exactly once; /readyz reports the outage and the recovery. Promoted at
// once, the standby takes writes before the worker's batches on the frozen
// primary time out: the database probe finds a writable host within a
// second, and /readyz reports the outage from the batches' statements
// left unanswered.
func TestQuickstartWorkerOutlivesAFrozenPrimaryAndItsStandbysPromotion(t *testing.T) {
	for _, promoteAfter := range []time.Duration{6 * time.Second, 0} {
		t.Run(fmt.Sprintf("promoted after %s", promoteAfter), func(t *testing.T) {
			freezePrimary(t, promoteAfter)
		})
	}
}

func freezePrimary(t *testing.T, promoteAfter time.Duration) {
	c := testcluster.Require(t)
	c.SetPGSync(t, true) // an acknowledged commit is on the standby: nothing is lost
	schema, queue := testdb.Name(t, "qs"), testdb.Name(t, "q")
	ctx := context.Background()
	pool, err := pgnodes.New(ctx, c.PGURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
		c.DeleteQueues(t, queue, queue+".retry", queue+".dlq")
	})
	var log testrun.LogBuffer
	o := options{pgURL: c.PGURL, amqpURLs: c.AMQPURLs, queue: queue, schema: schema, accounts: 7, healthAddr: freeAddr(t)}
	testrun.Start(t, func(ctx context.Context) error {
		return worker(ctx, o, slog.New(slog.NewTextHandler(&log, nil)))
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker log:\n%s", log.String())
		}
	})
	testrun.WaitFor(t, time.Minute, "the worker ready", func() bool { return ready(o.healthAddr) })
	probes := watchReadiness(t, o.healthAddr)
	feed := startDeposits(t, o)

	tables := idem.Tables{Schema: schema}
	testrun.WaitFor(t, time.Minute, "deposits applied before the freeze", func() bool {
		b, err := balances(ctx, pool, tables)
		return err == nil && len(b) > 0
	})
	time.Sleep(2 * time.Second)
	writable := watchWritable(t, c.PGStandby(t))
	frozenAt := time.Now()
	c.FreezePGPrimary(t)
	// A failover manager promotes after its own detection time, as in a
	// real outage: meanwhile no host takes writes, and readiness says so.
	time.Sleep(promoteAfter)
	c.PromotePGStandby(t)
	promotedAt := writable() // when the standby first took a write, not when the script returned
	t.Logf("primary frozen; standby promoted %s later (the script returned %s later)",
		promotedAt.Sub(frozenAt).Round(time.Millisecond), time.Since(frozenAt).Round(time.Millisecond))
	testrun.WaitFor(t, time.Minute, "the worker ready again", func() bool { return ready(o.healthAddr) })
	readyAgain := time.Now()
	time.Sleep(3 * time.Second) // deposits flow on the promoted node
	want := feed.stop()

	var got map[string]int64
	testrun.WaitFor(t, 2*time.Minute, "every distinct deposit applied", func() bool {
		got, _ = balances(ctx, pool, tables)
		return maps.Equal(got, want)
	})
	time.Sleep(2 * time.Second) // nothing arrives late and twice
	got, err = balances(ctx, pool, tables)
	require.NoError(t, err)
	require.Equal(t, want, got, "every deposit applied once")

	resumed := firstClaimAfter(t, pool, tables, promotedAt)
	notReadyAt, readyAt := probes.outage(frozenAt)
	t.Logf("applying again %s after the promotion (%s after the freeze); /readyz not ready %s after the freeze, ready again %s after the promotion (seen by WaitFor at %s)",
		resumed.Sub(promotedAt).Round(time.Millisecond), resumed.Sub(frozenAt).Round(time.Millisecond),
		notReadyAt.Sub(frozenAt).Round(time.Millisecond),
		readyAt.Sub(promotedAt).Round(time.Millisecond), readyAgain.Sub(promotedAt).Round(time.Millisecond))
	require.False(t, notReadyAt.IsZero(), "/readyz reported the outage")
	require.True(t, readyAt.After(notReadyAt), "/readyz reported the recovery")
	// The target, a bound of the design (per-host connect timeout,
	// statement deadlines), not a benchmark: docs/operations.md gives the
	// measured figures.
	require.LessOrEqual(t, resumed.Sub(promotedAt), freezeTarget, "deposits applied again within the target of the promotion")
}

// firstClaimAfter is when the first deposit claimed after at was claimed
// (its batch transaction's start, received_at, on the server's clock: the
// same machine's).
func firstClaimAfter(t *testing.T, pool *pgxpool.Pool, tables idem.Tables, at time.Time) time.Time {
	t.Helper()
	var first time.Time
	err := pool.QueryRow(context.Background(), `SELECT min(received_at) FROM `+tables.Table("inbox")+
		` WHERE consumer = 'quickstart' AND received_at > $1`, at).Scan(&first)
	require.NoError(t, err)
	return first
}

// watchWritable polls the node at url every 50 ms until it takes writes
// (no longer in recovery) or the test ends; the function it returns waits
// for that moment (a minute at most) and returns it.
func watchWritable(t *testing.T, url string) func() time.Time {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	at := make(chan time.Time, 1)
	go func() {
		defer close(at)
		for ctx.Err() == nil {
			if primary(ctx, url) {
				at <- time.Now()
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-at })
	return func() time.Time {
		select {
		case when, ok := <-at:
			require.True(t, ok, "the standby was promoted")
			return when
		case <-time.After(time.Minute):
			t.Fatal("the standby took no write within a minute of its promotion")
			return time.Time{}
		}
	}
}

// primary reports whether the node at url answers as a primary within a
// second.
func primary(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return false
	}
	defer conn.Close(context.Background())
	var recovering bool
	return conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering) == nil && !recovering
}

// readiness is what GET /readyz answered, polled every 100 ms.
type readiness struct {
	mu      sync.Mutex
	answers []readyAnswer
}

type readyAnswer struct {
	at    time.Time
	ready bool
}

// watchReadiness polls /readyz at addr until the test ends.
func watchReadiness(t *testing.T, addr string) *readiness {
	r := &readiness{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			ok := ready(addr)
			r.mu.Lock()
			r.answers = append(r.answers, readyAnswer{time.Now(), ok})
			r.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// outage returns the first answer not ready after from, and the first
// ready answer after that (zero times when there is none).
func (r *readiness) outage(from time.Time) (notReady, readyAgain time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.answers {
		switch {
		case a.at.Before(from):
		case notReady.IsZero() && !a.ready:
			notReady = a.at
		case !notReady.IsZero() && a.ready:
			return notReady, a.at
		}
	}
	return notReady, time.Time{}
}

// deposits publishes deposits of 1 to o.queue at about 200 a second until
// stopped.
type deposits struct {
	stop func() map[string]int64 // stops and returns the expected balances
}

func startDeposits(t *testing.T, o options) deposits {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pub, err := amqpnodes.NewPublisher(ctx, o.amqpURLs)
	require.NoError(t, err)
	want := map[string]int64{}
	done := make(chan error, 1)
	go func() {
		defer pub.Close()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; {
			select {
			case <-ctx.Done():
				done <- pub.Flush(context.Background())
				return
			case <-tick.C:
			}
			for range 10 {
				account := fmt.Sprintf("A%d", i%o.accounts+1)
				body, _ := json.Marshal(map[string]any{"account": account, "amount": 1})
				msg := amqp.Publishing{MessageId: fmt.Sprintf("frz-%d", i), ContentType: "application/json", Body: body}
				if err := pub.Publish(context.Background(), "", o.queue, msg); err != nil {
					done <- err
					return
				}
				want[account]++
				i++
			}
			if err := pub.Flush(context.Background()); err != nil {
				done <- err
				return
			}
		}
	}()
	var once sync.Once
	stop := func() map[string]int64 {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done, "publishing deposits")
		})
		return want
	}
	t.Cleanup(func() { stop() })
	return deposits{stop: stop}
}
