package retention

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/configerr"
)

// Defaults of Config.
const (
	// DefaultChunkSize is how many rows one DELETE removes.
	DefaultChunkSize = 1000
	// DefaultFloor is the shortest OlderThan accepted unless Config.Floor
	// says otherwise: seven days, the inbox's own floor
	// (inbox.DefaultFloor). See Config.Floor.
	DefaultFloor = inbox.DefaultFloor
	// DefaultLedgerOlderThan is how long settled effects are kept unless
	// Config.LedgerOlderThan says otherwise (or OlderThan is longer): 180
	// days. See Config.LedgerOlderThan.
	DefaultLedgerOlderThan = 180 * 24 * time.Hour
	// DefaultInterval is how often Run cleans.
	DefaultInterval = time.Hour
	// DefaultRoundTimeout bounds one round of Run.
	DefaultRoundTimeout = 15 * time.Minute
)

// Errors returned (wrapped) by Clean and Run.
var (
	// ErrBelowFloor means OlderThan, LedgerOlderThan or TombstonesOlderThan
	// is shorter than the floor: rows that young may still be needed to
	// recognise a redelivered or replayed message. Nothing was deleted. It
	// matches idem.ErrConfig.
	ErrBelowFloor = configerr.New("retention: older-than is below the retention floor")
	// ErrInvalidConfig means the Config cannot be used (no Pool, no
	// OlderThan, a negative value, unusable Tables). Nothing was deleted. It
	// matches idem.ErrConfig.
	ErrInvalidConfig = configerr.New("retention: invalid config")
)

// Config says what Clean deletes and how Run schedules it. Pool and
// OlderThan are required; every other field states its default.
type Config struct {
	// ChunkSize is how many rows one DELETE removes; each runs as its own
	// short transaction, so cleanup never holds many locks or a long
	// snapshot and can stop at any point without losing the work done.
	// Default: DefaultChunkSize (1000).
	ChunkSize int

	// Floor is the shortest OlderThan accepted: the replay and redelivery
	// horizon, the age below which a row may still be needed to recognise
	// a message delivered again (a lost ack, a producer retrying after an
	// outage, a normal replay into the live consumer's inbox). Clean
	// refuses a shorter OlderThan (or LedgerOlderThan, or a
	// TombstonesOlderThan that is set) with ErrBelowFloor. Raise it to the
	// retention of the streams you may replay from (their max-age); lower
	// it only deliberately. Default: DefaultFloor (7 days).
	Floor time.Duration

	// Interval is the time between two rounds of Run. Default:
	// DefaultInterval (1 hour).
	Interval time.Duration

	// Jitter is the most Run adds, at random, before each round, so that
	// workers started together do not all try at once. Default: a tenth
	// of Interval.
	Jitter time.Duration

	// LedgerOlderThan is the age past which settled effects (succeeded,
	// suppressed, and failed_terminal as an operator resolved them) are
	// deleted with their audit rows, counted from when they settled. Each
	// leaves a tombstone (see TombstonesOlderThan), so an effect recorded
	// again after it went is suppressed, never sent; what goes is the
	// detail an operator or a dispute needs: the request, the response,
	// the audit trail. At least Floor. Default: the longer of OlderThan and
	// DefaultLedgerOlderThan (180 days: past the usual 120-day window of
	// card payment disputes, and two quarterly reconciliations).
	LedgerOlderThan time.Duration

	// Logger receives Run's logs: a line per round with the counts. Default:
	// slog.Default().
	Logger *slog.Logger

	// MeterProvider provides the gauges idem.retention.last_success.timestamp
	// (set by every Clean that goes through, and by Run when it starts) and
	// idem.retention.interval (set by Run). Default: the global provider.
	MeterProvider metric.MeterProvider

	// OlderThan is the age past which rows are deleted, measured by the
	// database clock when a cleanup starts: inbox rows, dead letters,
	// finished replay runs and attempt counts (settled effects keep
	// LedgerOlderThan, tombstones TombstonesOlderThan, HTTP keys their own
	// expiry). At least Floor. Required.
	OlderThan time.Duration

	// Pool is the database. Required.
	Pool *pgxpool.Pool

	// RoundTimeout bounds one round of Run; a round cut short keeps what it
	// deleted and the next round goes on. Default: DefaultRoundTimeout (15
	// minutes).
	RoundTimeout time.Duration

	// Tables says where idem's tables live. Default: idem's defaults.
	Tables idem.Tables

	// TombstonesOlderThan is the age past which the ledger's tombstones are
	// deleted, counted from when retention removed their effect. A
	// tombstone is what makes an effect recorded again after retention (a
	// repair, a rebuild, a redrive, a producer retrying late) suppressed
	// instead of sent: once it goes, such an effect is sent again. Set it
	// only above the longest time anything can record an effect again:
	// the retention of the streams you may replay or repair from, of the
	// dead-letter queues you may redrive. At least Floor when set.
	// Default: 0, tombstones are kept for good (about a hundred bytes
	// each).
	TombstonesOlderThan time.Duration
}

func (c Config) withDefaults() Config {
	if c.ChunkSize == 0 {
		c.ChunkSize = DefaultChunkSize
	}
	if c.Floor == 0 {
		c.Floor = DefaultFloor
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Jitter == 0 {
		c.Jitter = c.Interval / 10
	}
	if c.LedgerOlderThan == 0 {
		c.LedgerOlderThan = max(c.OlderThan, DefaultLedgerOlderThan)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.RoundTimeout == 0 {
		c.RoundTimeout = DefaultRoundTimeout
	}
	c.Tables = c.Tables.WithDefaults()
	return c
}

// validate checks a defaulted Config.
func (c Config) validate() error {
	switch {
	case c.Pool == nil:
		return fmt.Errorf("%w: Pool is required", ErrInvalidConfig)
	case c.OlderThan <= 0:
		return fmt.Errorf("%w: OlderThan is required and must be positive", ErrInvalidConfig)
	case c.ChunkSize < 0, c.Floor < 0, c.Interval < 0, c.Jitter < 0, c.RoundTimeout < 0, c.LedgerOlderThan < 0,
		c.TombstonesOlderThan < 0:
		return fmt.Errorf("%w: ChunkSize, Floor, Interval, Jitter, LedgerOlderThan, RoundTimeout and TombstonesOlderThan "+
			"must not be negative", ErrInvalidConfig)
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{{"OlderThan", c.OlderThan}, {"LedgerOlderThan", c.LedgerOlderThan}, {"TombstonesOlderThan", c.TombstonesOlderThan}} {
		if d.value != 0 && d.value < c.Floor {
			return fmt.Errorf("%w: %s %s is below the floor %s; set Config.Floor (idem cleanup --floor) to go lower deliberately",
				ErrBelowFloor, d.name, d.value, c.Floor)
		}
	}
	if err := c.Tables.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}
