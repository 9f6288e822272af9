package consumer

import (
	"context"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/faultproxy"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

func TestHealthIsReadyOnlyWhileConsuming(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.newConsumer(e.effectHandler(), nil)
	h := c.Health()
	require.False(t, h.Ready)
	require.True(t, h.Live)
	require.Contains(t, h.Reason, "not running")

	stop := start(t, c)
	waitFor(t, 10*time.Second, "ready", func() bool { return c.Health().Ready })
	require.True(t, c.Health().Live)
	require.Empty(t, c.Health().Reason)
	stop()
	require.False(t, c.Health().Ready)
	require.True(t, c.Health().Live, "a clean shutdown is not a failure")
}

func TestHealthIsNotReadyWhileTheBrokerIsUnreachable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.newConsumer(e.effectHandler(), func(cfg *Config) { cfg.AMQPURL = "amqp://guest:guest@127.0.0.1:1/" })
	start(t, c)
	waitFor(t, 10*time.Second, "the first dial failed", func() bool { return c.Health().Reason != "not running" && c.Health().Reason != "connecting" })
	h := c.Health()
	require.False(t, h.Ready)
	require.True(t, h.Live, "reconnecting is progress")
	require.Contains(t, h.Reason, "broker unavailable")
}

// A wrong password is not an outage: Run fails at the first dial with a
// clear error instead of retrying forever, and the consumer reports not live.
func TestWrongCredentialsFailFastAtTheFirstDial(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	u, err := url.Parse(testbroker.URL())
	require.NoError(t, err)
	u.User = url.UserPassword("guest", "not-the-password")
	c := e.newConsumer(e.effectHandler(), func(cfg *Config) { cfg.AMQPURL = u.String() })
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	select {
	case err := <-done:
		require.Error(t, err)
		require.Contains(t, err.Error(), "username or password not allowed")
		require.NotContains(t, err.Error(), "not-the-password")
	case <-time.After(20 * time.Second):
		t.Fatal("Run kept retrying a refused login")
	}
	h := c.Health()
	require.False(t, h.Live)
	require.False(t, h.Ready)
	require.Contains(t, h.Reason, "stopped")
}

// A database that refuses the worker, or stops answering it, makes the
// consumer not ready within seconds, even with the broker up and batches
// retrying; once it answers again the consumer is ready and the message
// that waited is applied once.
func TestHealthIsNotReadyWithinSecondsWhileTheDatabaseIsAway(t *testing.T) {
	t.Parallel()
	for name, fail := range map[string]func(p *faultproxy.Proxy){
		"refused":    (*faultproxy.Proxy).Refuse,
		"blackholed": (*faultproxy.Proxy).Stall,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			pool, proxy := testdb.Proxied(t)
			c := e.newConsumer(e.effectHandler(), func(cfg *Config) { cfg.Pool = pool; cfg.CommitTimeout = 2 * time.Second })
			start(t, c)
			waitFor(t, 10*time.Second, "ready", func() bool { return c.Health().Ready })

			fail(proxy)
			e.publish("m-1", `{}`, nil) // its batches fail and retry
			began := time.Now()
			waitFor(t, 10*time.Second, "not ready", func() bool { return !c.Health().Ready })
			h := c.Health()
			t.Logf("not ready %s after the database went %s: %s", time.Since(began).Round(time.Millisecond), name, h.Reason)
			require.Contains(t, h.Reason, "database")

			proxy.Resume()
			waitFor(t, 30*time.Second, "ready again", func() bool { return c.Health().Ready })
			waitFor(t, 30*time.Second, "m-1 applied", func() bool { return e.eff.Counts()["m-1"] == 1 })
		})
	}
}

// A batch whose connection stops answering in the middle of its
// transaction (a pool's connections to a primary that froze, while the
// probe reaches a host that answers) makes the consumer not ready within
// seconds of engine.AnswerLimit, long before the commit times out, while
// the database probe is content; once the connection answers again the
// consumer is ready and the message is applied once.
func TestHealthIsNotReadyWhileABatchStatementGoesUnanswered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pool, proxy := testdb.Proxied(t)
	inHandler, stalled := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, tx pgx.Tx, m *Message) error {
		if err := e.eff.Insert(ctx, tx, m.ID); err != nil {
			return err
		}
		if m.ID == "m-1" { // the batch's next statement goes unanswered
			once.Do(func() { close(inHandler); <-stalled })
		}
		return nil
	}
	c := e.newConsumer(h, func(cfg *Config) { cfg.Pool = pool; cfg.CommitTimeout = time.Minute })
	start(t, c)
	waitFor(t, 10*time.Second, "ready", func() bool { return c.Health().Ready })

	e.publish("m-1", `{}`, nil)
	select {
	case <-inHandler:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not run")
	}
	proxy.StallOpen() // the batch's connection, and the probe's: new ones pass
	stalledAt := time.Now()
	close(stalled)
	waitFor(t, 30*time.Second, "not ready for a statement unanswered, with the probe content", func() bool {
		dbOK, _ := c.eng.DB.Check()
		return dbOK && !c.Health().Ready
	})
	rep := c.Health()
	t.Logf("not ready %s after the connection stopped answering: %s", time.Since(stalledAt).Round(time.Millisecond), rep.Reason)
	require.Contains(t, rep.Reason, "unanswered")
	require.Zero(t, e.eff.Counts()["m-1"], "the batch has not committed")

	proxy.Resume()
	waitFor(t, 30*time.Second, "m-1 applied", func() bool { return e.eff.Counts()["m-1"] == 1 })
	waitFor(t, 30*time.Second, "ready again", func() bool { return c.Health().Ready })
}

// Batch transactions that keep failing are tracked from the first failure
// to the first commit, with the last failure: past engine.FailingLimit the
// consumer is not ready, naming it.
func TestBatchesThatKeepFailingAreReportedUntilOneCommits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.newConsumer(e.effectHandler(), nil)
	v := &c.eng.Vitals
	_, _, failing := v.Failing(0)
	require.False(t, failing)
	start(t, c)
	waitFor(t, 10*time.Second, "ready", func() bool { return c.Health().Ready })
	// A table the claim needs is gone: every batch transaction fails.
	_, err := e.pool.Exec(context.Background(), "ALTER TABLE "+e.tables.Table("inbox")+" RENAME TO gone")
	require.NoError(t, err)
	e.publish("m-1", `{}`, nil)
	waitFor(t, 10*time.Second, "a failed batch", func() bool { _, _, f := v.Failing(0); return f })
	d, why, _ := v.Failing(0)
	require.Less(t, d, 10*time.Second)
	require.Contains(t, why, "does not exist")
	_, err = e.pool.Exec(context.Background(), "ALTER TABLE "+e.tables.QuotedSchema()+".gone RENAME TO "+
		strings.TrimPrefix(e.tables.Table("inbox"), e.tables.QuotedSchema()+"."))
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "m-1 applied", func() bool { return e.eff.Counts()["m-1"] == 1 })
	_, _, failing = v.Failing(0)
	require.False(t, failing, "a commit ends the streak")
}
