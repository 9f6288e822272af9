package idem_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/inbox/httpinbox"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/partitions"
	"github.com/idemkit/idem/projection"
	"github.com/idemkit/idem/prommetrics"
	"github.com/idemkit/idem/replay"
	"github.com/idemkit/idem/replay/replaycmd"
	"github.com/idemkit/idem/retention"
	"github.com/idemkit/idem/run"
)

// A configuration that a package cannot use is refused with an error that
// matches idem.ErrConfig, whichever package refused it, so a program can
// tell "fix the configuration" from "try again" with one errors.Is. None of
// these reaches a server: a pool is created but never connects.
func TestEveryPackagesBadConfigurationMatchesErrConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://idem@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	const url = "amqp://guest:guest@127.0.0.1:1/"
	badTables := idem.Tables{Schema: strings.Repeat("s", 64)}
	ib, err := inbox.New(inbox.Config{})
	require.NoError(t, err)
	noPool, err := ledger.New(ledger.Config{})
	require.NoError(t, err)

	for name, refuse := range map[string]func() error{
		"idem: Tables":                     badTables.Validate,
		"migrate: Up with unusable Tables": func() error { _, err := migrate.Up(ctx, pool, badTables); return err },
		"consumer: empty Config":           func() error { _, err := consumer.New(consumer.Config{}); return err },
		"consumer: AMQPURL and AMQPURLs": func() error {
			_, err := consumer.New(consumer.Config{Name: "c", Queue: "q", Pool: pool, AMQPURL: url, AMQPURLs: []string{url}})
			return err
		},
		"inbox: MaxIDBytes": func() error { _, err := inbox.New(inbox.Config{MaxIDBytes: -1}); return err },
		"inbox: Cleanup ChunkSize": func() error {
			_, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: 30 * 24 * time.Hour, ChunkSize: -1})
			return err
		},
		"inbox: Cleanup below the floor": func() error {
			_, err := ib.Cleanup(ctx, pool, inbox.CleanupOptions{OlderThan: time.Second})
			return err
		},
		"httpinbox: no scope": func() error { _, err := httpinbox.New(pool, httpinbox.Config{}); return err },
		"httpinbox: no pool":  func() error { _, err := httpinbox.New(nil, httpinbox.Config{SharedScope: true}); return err },
		"httpinbox: Keys with unusable Tables": func() error {
			_, err := httpinbox.NewKeys(pool, badTables)
			return err
		},
		"ledger: New with unusable Tables":       func() error { _, err := ledger.New(ledger.Config{Tables: badTables}); return err },
		"ledger: operator function without Pool": func() error { _, err := noPool.Stats(ctx); return err },
		"ledger: dispatcher without Pool":        func() error { _, err := ledger.NewDispatcher(ledger.DispatcherConfig{}); return err },
		"ledger: dispatcher without executors": func() error {
			_, err := ledger.NewDispatcher(ledger.DispatcherConfig{Pool: pool})
			return err
		},
		"ledger: nil executor": func() error {
			_, err := ledger.NewDispatcher(ledger.DispatcherConfig{Pool: pool, Executors: map[string]ledger.Executor{"x": nil}})
			return err
		},
		"ledger: AMQP executor with a malformed URL": func() error {
			_, err := ledger.NewAMQPExecutor(ledger.AMQPConfig{URL: "amqp://h1/,amqp://h2/"})
			return err
		},
		"deadletters: redrive without a broker": func() error {
			_, err := deadletters.Redrive(ctx, deadletters.RedriveOptions{Pool: pool, Queue: "q"})
			return err
		},
		"deadletters: redrive without Pool": func() error {
			_, err := deadletters.Redrive(ctx, deadletters.RedriveOptions{AMQPURL: url, Queue: "q"})
			return err
		},
		"deadletters: redrive with a negative Limit": func() error {
			_, err := deadletters.Redrive(ctx, deadletters.RedriveOptions{AMQPURL: url, Pool: pool, Queue: "q", Limit: -1})
			return err
		},
		"deadletters: redrive into its own queue": func() error {
			_, err := deadletters.Redrive(ctx, deadletters.RedriveOptions{AMQPURL: url, Pool: pool, Queue: "q", DeadLetterQueue: "q"})
			return err
		},
		"deadletters: DeleteBefore with no chunk": func() error {
			_, err := deadletters.DeleteBefore(ctx, pool, idem.Tables{}, time.Now(), 0)
			return err
		},
		"ledger: DeleteSettled with no chunk": func() error {
			_, _, err := ledger.DeleteSettled(ctx, pool, idem.Tables{}, time.Now(), 0)
			return err
		},
		"replay: DeleteFinishedRuns with no chunk": func() error {
			_, _, _, err := replay.DeleteFinishedRuns(ctx, pool, idem.Tables{}, time.Now(), 0)
			return err
		},
		"retention: empty Config": func() error { _, err := retention.Clean(ctx, retention.Config{}); return err },
		"retention: below the floor": func() error {
			_, err := retention.Clean(ctx, retention.Config{Pool: pool, OlderThan: time.Second})
			return err
		},
		"replay: position":         func() error { _, err := replay.ParsePosition("soon"); return err },
		"replay: options":          func() error { return replay.ErrInvalidOptions },
		"replaycmd: usage":         func() error { return replaycmd.ErrUsage },
		"projection: empty Config": func() error { _, err := projection.New(projection.Config{}); return err },
		"health: address":          func() error { return health.ListenAndServe(ctx, "no port") },
		"prommetrics: address":     func() error { _, err := prommetrics.Serve("no port", nil); return err },
		"run: nil part":            func() error { return run.All(ctx, func(context.Context) error { return nil }, nil) },
		"amqpnodes: no URL":        func() error { _, _, err := amqpnodes.Dial(ctx, nil, amqp.Config{}); return err },
		"amqpnodes: malformed URL": func() error {
			_, _, err := amqpnodes.Dial(ctx, []string{"amqp://h1/,amqp://h2/"}, amqp.Config{})
			return err
		},
		"amqpnodes: Split": func() error { _, err := amqpnodes.Split(""); return err },
		"partitions: no queue": func() error {
			_, err := partitions.Publish(ctx, nil, "", 4, "k", amqp.Publishing{})
			return err
		},
	} {
		if err := refuse(); !errors.Is(err, idem.ErrConfig) {
			t.Errorf("%s: %v does not match idem.ErrConfig", name, err)
		}
	}
}
