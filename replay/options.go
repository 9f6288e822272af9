package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/configerr"
	"github.com/idemkit/idem/internal/streamio"
	"github.com/idemkit/idem/projection"
)

// Options configure Run. Mode is required; so are Select, Operator and
// Reason for a repair. Every other field has the default its comment states.
type Options struct {
	// AllowBelowHorizon lets a normal replay start (or resume) at or below
	// the inbox horizon, where retention deleted the live consumer's inbox
	// rows (see inbox.ErrBeyondHorizon), and go on when a clean-up moves the
	// horizon past it during the run; it lets a rebuild's catch-up, which
	// claims in the live scope, go on likewise: the handler runs again on
	// those messages. Other modes do not refuse for the horizon. Default:
	// false.
	AllowBelowHorizon bool

	// BatchSize is the most messages run in one transaction. Default:
	// 1000, or the consumer's BatchMaxSize when larger: a replay reads what
	// is already stored, so its batches are full, and larger batches
	// amortise the commit and the inbox statement better.
	BatchSize int

	// From is where the replay starts. Default: First.
	From Position

	// Logger receives the run's logs. Default: the consumer's Logger.
	Logger *slog.Logger

	// Mode is idem.Normal, idem.Rebuild, idem.Forensic or idem.Repair.
	// Required.
	Mode idem.Mode

	// Operator says who runs a repair, for the audit rows. Required for
	// repair.
	Operator string

	// Progress receives a progress bar with rate and ETA when it is a
	// terminal, a log line every ProgressInterval otherwise; an online
	// rebuild's shows its phase, its lag behind the live consumer and the
	// swap. Default: none.
	Progress io.Writer

	// ProgressInterval is how often a progress line is written when Progress
	// is not a terminal. Default: 5s.
	ProgressInterval time.Duration

	// Projection, in a rebuild, declares the tables the handler writes
	// (projection.Projection.Table sends its writes to their shadows): the
	// rebuild runs online, beside the live consumer, which keeps running,
	// and swaps the rebuilt tables in at the end (see the package
	// documentation). Without it a rebuild runs in place: Reset, the live
	// consumer paused. Default: none.
	Projection *projection.Projection

	// Reason says why a repair runs, for the audit rows. Required for repair.
	Reason string

	// Redispatch, in a repair, sends the failed_terminal and unknown effects
	// of the re-run messages again (status pending, same idempotency key,
	// each decision in the ledger's audit). Effects must have been recorded
	// with their Consumer and MessageID for the repair to find them.
	// Default: false (effects stay deduplicated by effect id).
	Redispatch bool

	// Report receives the forensic report, one JSON object per line: one
	// per message, then a summary. Default: none (Run still returns the
	// Summary).
	Report io.Writer

	// Reset runs before an in-place rebuild's first message, in the
	// transaction that registers the run: truncate the projection here. It
	// does not run again when the run is resumed. An online rebuild
	// (Projection) starts from empty shadow tables instead.
	Reset func(ctx context.Context, tx pgx.Tx) error

	// RetryDelay is the wait before a failing message is tried again in
	// place; it doubles with each attempt up to 5s. After the consumer's
	// MaxAttempts the message is dead-lettered (reason max_attempts) and
	// counted as a handler error. Default: 100ms.
	RetryDelay time.Duration

	// RunID names the run. Pass the id of an interrupted run to resume it
	// from its checkpoint, with the end, selection and hand-off fixed when it
	// first started. Default: generated.
	RunID string

	// Select chooses the messages a repair re-runs. Required for repair.
	Select Selection

	// Stream is the stream to replay. Default: the stream the consumer reads.
	Stream string

	// To is where the replay ends, inclusive. Default: Tail. An in-place
	// rebuild's end must be Tail or an Offset: the hand-off needs an exact
	// offset. An online rebuild ends where the live consumer is when it
	// swaps: its To must be Tail.
	To Position

	// Wait makes an in-place rebuild wait for the live consumer's stream
	// lock instead of failing with ErrLiveWorker while a live worker holds
	// it.
	Wait bool

	// now is time.Now; tests replace it.
	now func() time.Time
	// beforeSwapCommit, when set, runs in the swap transaction just before
	// it commits; tests interrupt the swap here.
	beforeSwapCommit func(ctx context.Context) error
}

// Selection chooses messages for a repair: those whose business key (see
// consumer.Config.BusinessKey) is in Keys, or whose message id is in IDs.
type Selection struct {
	// Keys are business keys.
	Keys []string
	// IDs are message ids.
	IDs []string
}

// empty reports whether s selects nothing.
func (s Selection) empty() bool { return len(s.Keys) == 0 && len(s.IDs) == 0 }

// matcher returns the predicate of a repair's engine.Ordered.Select.
func (s Selection) matcher() func(m *consumer.Message) bool {
	keys := make(map[string]bool, len(s.Keys))
	for _, k := range s.Keys {
		keys[k] = true
	}
	ids := make(map[string]bool, len(s.IDs))
	for _, id := range s.IDs {
		ids[id] = true
	}
	return func(m *consumer.Message) bool {
		return ids[m.ID] || (m.BusinessKey != "" && keys[m.BusinessKey])
	}
}

// Errors returned by Run (wrapped). Arguments that make no sense are
// reported before anything runs.
var (
	// ErrInvalidOptions means the options cannot describe a replay: an
	// unknown mode, an end before the start, a time in the future, a repair
	// without selection, operator or reason. It matches idem.ErrConfig.
	ErrInvalidOptions = configerr.New("replay: invalid options")
	// ErrLiveWorker means a live worker holds the consumer's stream lock, so
	// a rebuild cannot pause it. Stop the live workers, or set Options.Wait.
	ErrLiveWorker = errors.New("replay: a live worker holds the stream lock")
	// ErrLiveMoved means the live consumer processed messages while an
	// interrupted rebuild was waiting to resume: its writes went into a
	// projection the rebuild had reset. Start a new rebuild.
	ErrLiveMoved = errors.New("replay: the live consumer moved while the rebuild was interrupted")
	// ErrRunMismatch means RunID names a run of another mode, consumer,
	// stream or projection, or one that cannot be resumed or abandoned
	// (abandoned, or not an online rebuild).
	ErrRunMismatch = errors.New("replay: run id belongs to another replay")
	// ErrRebuildRunning means another process is running an online rebuild
	// of the same consumer and stream.
	ErrRebuildRunning = errors.New("replay: another rebuild of this consumer is running")
	// ErrRebuildPending means an online rebuild of the consumer was
	// interrupted and its shadow tables are still there: resume it (its
	// RunID) or abandon it (Abandon) before starting another.
	ErrRebuildPending = errors.New("replay: an interrupted rebuild of this consumer is pending")
	// ErrFindings means a forensic replay found payload conflicts or
	// messages whose handler failed. The report says which.
	ErrFindings = errors.New("replay: forensic replay found conflicts, failed handlers or dead letters")
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidOptions, fmt.Sprintf(format, args...))
}

// defaultBatchSize is the smallest default batch of a replay.
const defaultBatchSize = 1000

// withDefaults fills the defaults from the consumer's cfg and checks what
// can be checked without the broker or the database.
func (o Options) withDefaults(cfg consumer.Config) (Options, error) {
	if o.now == nil {
		o.now = time.Now
	}
	if o.BatchSize <= 0 {
		o.BatchSize = max(cfg.BatchMaxSize, defaultBatchSize)
	}
	if o.Logger == nil {
		o.Logger = cfg.Logger
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = 5 * time.Second
	}
	if o.RetryDelay <= 0 {
		o.RetryDelay = 100 * time.Millisecond
	}
	if o.Stream == "" {
		o.Stream = cfg.Stream
	}
	o.From, o.To = o.From.or(First()), o.To.or(Tail())
	o.Select.Keys, o.Select.IDs = clean(o.Select.Keys), clean(o.Select.IDs)
	return o, o.validate(cfg)
}

func (o Options) validate(cfg consumer.Config) error {
	now := o.now()
	switch o.Mode {
	case idem.Normal, idem.Rebuild, idem.Forensic, idem.Repair:
	case idem.Live:
		return invalid("Mode is required (normal, rebuild, forensic or repair)")
	default:
		return invalid("unknown mode %q (want normal, rebuild, forensic or repair)", o.Mode)
	}
	switch {
	case o.Stream == "":
		return invalid("no stream: set Options.Stream")
	case o.From.kind() == streamio.PositionTail:
		return invalid("a replay cannot start at the tail")
	case o.To.kind() == streamio.PositionFirst:
		return invalid("a replay cannot end at first")
	case o.From.kind() == streamio.PositionTime && o.From.when().After(now):
		return invalid("start %s is in the future", o.From)
	case o.To.kind() == streamio.PositionTime && o.To.when().After(now):
		return invalid("end %s is in the future: the end must be fixed when the replay starts", o.To)
	case o.From.kind() == streamio.PositionOffset && o.To.kind() == streamio.PositionOffset && o.To.at() < o.From.at(),
		o.From.kind() == streamio.PositionTime && o.To.kind() == streamio.PositionTime && o.To.when().Before(o.From.when()):
		return invalid("end %s is before start %s", o.To, o.From)
	case o.Mode == idem.Rebuild && o.To.kind() == streamio.PositionTime:
		return invalid("a rebuild ends at the tail or at an offset: the hand-off needs an exact offset")
	case o.Mode != idem.Repair && (!o.Select.empty() || o.Redispatch):
		return invalid("a selection and Redispatch are for repair only")
	case o.Mode != idem.Rebuild && o.Reset != nil:
		return invalid("Reset is for rebuild only")
	case o.Mode != idem.Rebuild && o.Wait:
		return invalid("Wait is for rebuild only")
	case o.Mode != idem.Rebuild && o.Projection != nil:
		return invalid("Projection is for rebuild only")
	case o.Projection != nil && o.Reset != nil:
		return invalid("Reset is for an in-place rebuild: an online rebuild (Projection) starts from empty shadow tables")
	case o.Projection != nil && o.Wait:
		return invalid("Wait is for an in-place rebuild: an online rebuild runs beside the live workers")
	case o.Projection != nil && o.To.kind() != streamio.PositionTail:
		return invalid("an online rebuild ends where the live consumer is when it swaps: To must be the tail")
	case o.Mode == idem.Forensic && o.RunID != "":
		return invalid("a forensic replay writes nothing, so it has no run to resume: run it again")
	case o.Mode == idem.Repair && o.Select.empty() && o.RunID == "":
		return invalid("a repair needs a selection: business keys or message ids")
	case o.Mode == idem.Repair && o.RunID == "" && (strings.TrimSpace(o.Operator) == "" || strings.TrimSpace(o.Reason) == ""):
		return invalid("a repair needs an operator and a reason for the audit")
	case o.Mode == idem.Repair && len(o.Select.Keys) > 0 && cfg.BusinessKey == nil:
		return invalid("selecting by business key needs the consumer's Config.BusinessKey")
	}
	return nil
}

// clean drops empty and repeated entries.
func clean(list []string) []string {
	var out []string
	for _, s := range list {
		if s = strings.TrimSpace(s); s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
