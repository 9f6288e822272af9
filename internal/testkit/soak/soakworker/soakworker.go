// Package soakworker is the soak's own worker: the one place where a handler
// misbehaves on purpose. The examples are what users copy, so they carry no
// fault hooks; this worker does, and the soak runs it as one more workload
// (`soak worker`, see package main).
//
// It consumes the soak's liveness workload: deposits to hot accounts, as
// in the quickstart example, with a plain increment and without an ordering
// key, so that parallel batches and competing processes contend for the same
// rows. Each application is also logged in an applied table (message id,
// worker tag) without a unique key, so that a message applied twice shows as
// two rows. A deposit whose "fault" field names a fault misbehaves instead
// of depositing:
//
//   - FaultHangSQL blocks in SELECT pg_sleep(3600): a hang that honours its
//     context (the runtime cancels the statement at HandlerTimeout);
//   - FaultHangGo sleeps without looking at its context: the runtime must
//     abandon it;
//   - FaultCrashExit exits the process (os.Exit(3));
//   - FaultCrashPanic panics in a goroutine of its own (exit status 2).
//
// Before crashing, the worker writes CrashMarker, the fault and the message
// id on a line of its own to standard error, so that its supervisor can tell
// a crash it asked for from one it did not (ParseCrash).
//
// Only public packages are used (consumer, migrate, idem): the worker is
// built the way a user's worker is.
package soakworker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/migrate"
)

// Faults a deposit can ask for in its "fault" field.
const (
	// FaultHangSQL blocks the handler in SELECT pg_sleep(3600).
	FaultHangSQL = "hang_sql"
	// FaultHangGo blocks the handler in a sleep that ignores its context.
	FaultHangGo = "hang_go"
	// FaultCrashExit exits the worker process with status 3.
	FaultCrashExit = "crash_exit"
	// FaultCrashPanic panics in a new goroutine, which kills the process
	// with status 2 whatever the handler recovers.
	FaultCrashPanic = "crash_panic"
)

// CrashMarker starts the line the worker writes to standard error just
// before a crash fault kills it: "soak-poison: FAULT MESSAGE_ID".
const CrashMarker = "soak-poison:"

// ConsumerName is the worker's consumer Name: its inbox scope.
const ConsumerName = "liveness"

// crashExitCode is the status FaultCrashExit exits with.
const crashExitCode = 3

// hangGoFor is how long FaultHangGo sleeps: far beyond any HandlerTimeout
// the soak sets plus the runtime's abandonment grace, and still bounded, so
// that an abandoned goroutine ends on its own.
const hangGoFor = time.Minute

// Deposit is the message body.
type Deposit struct {
	Account string `json:"account"`
	Amount  *int64 `json:"amount"`
	Fault   string `json:"fault,omitempty"`
}

// Body returns the JSON body of a deposit; fault is "" for a healthy one.
func Body(account string, amount int64, fault string) []byte {
	if fault == "" {
		return fmt.Appendf(nil, `{"account":%q,"amount":%d}`, account, amount)
	}
	return fmt.Appendf(nil, `{"account":%q,"amount":%d,"fault":%q}`, account, amount, fault)
}

// ParseCrash finds the last crash marker in a worker's output and returns
// the fault and message id it names, and whether there was one.
func ParseCrash(output []byte) (fault, id string, ok bool) {
	for line := range bytes.Lines(output) {
		rest, found := strings.CutPrefix(strings.TrimSpace(string(line)), CrashMarker)
		if !found {
			continue
		}
		if f, m, two := strings.Cut(strings.TrimSpace(rest), " "); two && (f == FaultCrashExit || f == FaultCrashPanic) {
			fault, id, ok = f, m, true
		}
	}
	return fault, id, ok
}

// ExitStatus is the exit status a crash fault ends the process with.
func ExitStatus(fault string) int {
	if fault == FaultCrashExit {
		return crashExitCode
	}
	return 2 // the Go runtime's status for an unrecovered panic
}

// Config configures the worker.
type Config struct {
	// AMQPURLs are the broker's nodes; PGURL says where PostgreSQL is.
	AMQPURLs []string
	PGURL    string
	// HandlerTimeout, MaxAttempts and RetryBaseDelay go to consumer.Config.
	HandlerTimeout time.Duration
	MaxAttempts    int
	RetryBaseDelay time.Duration
	// Logger receives the worker's and the runtime's logs.
	Logger *slog.Logger
	// Queue is the queue to consume.
	Queue string
	// Schema holds idem's tables, the balances and the applied log.
	Schema string
	// Tag names this process in the applied log (several processes of the
	// one consumer may run at once).
	Tag string
}

// Table names, in the worker's schema.
func balancesTable(t idem.Tables) string { return pgx.Identifier{t.Schema, "balances"}.Sanitize() }
func appliedTable(t idem.Tables) string  { return pgx.Identifier{t.Schema, "applied"}.Sanitize() }

// Run migrates the schema, creates the business tables and consumes until
// ctx ends.
func Run(ctx context.Context, cfg Config) error {
	pool, err := pgxpool.New(ctx, cfg.PGURL)
	if err != nil {
		return fmt.Errorf("soakworker: connect to postgres: %w", err)
	}
	defer pool.Close()
	tables := idem.Tables{Schema: cfg.Schema}
	if _, err := migrate.Up(ctx, pool, tables); err != nil {
		return fmt.Errorf("soakworker: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+balancesTable(tables)+` (
		account text PRIMARY KEY,
		balance bigint NOT NULL);
	CREATE TABLE IF NOT EXISTS `+appliedTable(tables)+` (
		message_id text NOT NULL,
		account text NOT NULL,
		amount bigint NOT NULL,
		worker text NOT NULL)`); err != nil {
		return fmt.Errorf("soakworker: create the business tables: %w", err)
	}
	c, err := consumer.New(consumer.Config{
		AMQPURLs:       cfg.AMQPURLs,
		Name:           ConsumerName,
		Pool:           pool,
		Queue:          cfg.Queue,
		Tables:         tables,
		Logger:         cfg.Logger,
		HandlerTimeout: cfg.HandlerTimeout,
		MaxAttempts:    cfg.MaxAttempts,
		RetryBaseDelay: cfg.RetryBaseDelay,
		// No OrderingKey: parallel batches, and other processes, update
		// the same hot rows in any order.
	})
	if err != nil {
		return fmt.Errorf("soakworker: %w", err)
	}
	c.Handle(consumer.JSON(handler(tables, cfg.Tag)))
	cfg.Logger.Info("worker started", "queue", cfg.Queue, "schema", cfg.Schema, "tag", cfg.Tag,
		"handler_timeout", cfg.HandlerTimeout, "max_attempts", cfg.MaxAttempts)
	err = c.Run(ctx)
	s := c.Stats()
	cfg.Logger.Info("worker stopped", "processed", s.Processed, "duplicates", s.Duplicates, "dead_lettered", s.DeadLettered,
		"retried", s.Retried, "contention", s.Contention, "abandoned_handlers", s.AbandonedHandlers)
	return err
}

// handler deposits, or misbehaves as the deposit's fault asks.
func handler(tables idem.Tables, tag string) func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d Deposit) error {
	increment := `INSERT INTO ` + balancesTable(tables) + ` AS b (account, balance) VALUES ($1, $2)
		ON CONFLICT (account) DO UPDATE SET balance = b.balance + EXCLUDED.balance`
	logApplied := `INSERT INTO ` + appliedTable(tables) + ` (message_id, account, amount, worker) VALUES ($1, $2, $3, $4)`
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message, d Deposit) error {
		switch d.Fault {
		case "":
		case FaultHangSQL:
			_, err := tx.Exec(ctx, `SELECT pg_sleep(3600)`)
			return err
		case FaultHangGo:
			time.Sleep(hangGoFor) // never looks at ctx
			return nil
		case FaultCrashExit, FaultCrashPanic:
			crash(d.Fault, m.ID)
		default:
			return consumer.DeadLetter("invalid_fault", fmt.Errorf("unknown fault %q", d.Fault))
		}
		if d.Account == "" || d.Amount == nil {
			return consumer.DeadLetter("invalid_deposit", errors.New("account and amount are required"))
		}
		if _, err := tx.Exec(ctx, increment, d.Account, *d.Amount); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, logApplied, m.ID, d.Account, *d.Amount, tag)
		return err
	}
}

// crash kills the process as fault says, after telling the supervisor.
func crash(fault, id string) {
	fmt.Fprintf(os.Stderr, "%s %s %s\n", CrashMarker, fault, id)
	if fault == FaultCrashExit {
		os.Exit(crashExitCode)
	}
	go func() { panic("soak: poison message " + id) }()
	time.Sleep(hangGoFor) // the panic ends the process first
}
