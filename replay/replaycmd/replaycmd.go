package replaycmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/internal/configerr"
	"github.com/idemkit/idem/replay"
)

// Command configures Main.
type Command struct {
	// Options are the defaults the flags override; set the ones flags do
	// not cover here (Projection, Reset, Logger, BatchSize…).
	Options replay.Options
	// KeyFlag names the flag that selects repair messages by business key,
	// e.g. "order" for --order o-1,o-2. Default: "key".
	KeyFlag string
	// Stdout receives the forensic report when --report is not given.
	// Default: os.Stdout.
	Stdout io.Writer
	// Stderr receives usage, progress and the summary. Default: os.Stderr.
	Stderr io.Writer
}

// ErrUsage is returned (wrapped) by Main for arguments it cannot parse. It
// matches idem.ErrConfig.
var ErrUsage = configerr.New("replaycmd: usage")

// Main is the "replay" subcommand of a worker binary: it parses args
// (without the subcommand's name), runs the replay with c, the worker's
// stream consumer (its Config.Stream is the live stream), and prints a
// summary. A worker binary adds it next to its worker:
//
//	case "replay":
//		return replaycmd.Main(ctx, c, args[1:], replaycmd.Command{Options: replay.Options{Projection: overview}})
//
// and exits with ExitCode(err). With Options.Projection, --mode rebuild
// runs online, beside the running workers; with --in-place (and
// Options.Reset) it rebuilds in place. Flags:
//
//	--mode normal|rebuild|forensic|repair   (required)
//	--from first|OFFSET|RFC3339             where to start (default first)
//	--to tail|OFFSET|RFC3339                where to end, fixed at start (default tail)
//	--run-id ID                             resume the interrupted run ID
//	--abandon                               rebuild: abandon the interrupted online rebuild --run-id
//	--in-place                              rebuild: in place (Options.Reset, live workers paused)
//	--key K1,K2 / --id ID1,ID2              repair: the messages to re-run
//	--operator NAME --reason TEXT           repair: the audit (operator defaults to $USER)
//	--redispatch                            repair: send failed / unknown effects again
//	--report FILE                           forensic: the JSON-lines report (default stdout)
//	--wait                                  in-place rebuild: wait for live workers to release the stream
//	--batch N                               messages per transaction
//	--allow-below-horizon                   normal: start where retention made the inbox forget
func Main(ctx context.Context, c *consumer.Consumer, args []string, cmd Command) error {
	if cmd.KeyFlag == "" {
		cmd.KeyFlag = "key"
	}
	if cmd.Stdout == nil {
		cmd.Stdout = os.Stdout
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	o, f, err := cmd.parse(args)
	if err != nil {
		return err
	}
	if f.abandon {
		return abandonRun(ctx, c, o, cmd.Stderr)
	}
	if o.Progress == nil {
		o.Progress = cmd.Stderr
	}
	if o.Mode == idem.Forensic && o.Report == nil {
		o.Report = cmd.Stdout
		if f.report != "" && f.report != "-" {
			file, err := os.Create(f.report)
			if err != nil {
				return fmt.Errorf("replay: report: %w", err)
			}
			defer file.Close()
			o.Report = file
		}
	} else if f.report != "" && o.Mode != idem.Forensic {
		return fmt.Errorf("%w: --report is for forensic replays", ErrUsage)
	}
	s, err := replay.Run(ctx, c, o)
	if errors.Is(err, replay.ErrInvalidOptions) {
		err = fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if err == nil || s.RunID != "" || s.Messages > 0 {
		printSummary(cmd.Stderr, s)
	}
	return err
}

// flags are the flags of Main that are not options.
type flags struct {
	mode, from, to, report string
	abandon, inPlace       bool
}

// parse reads args into the options cmd.Options give defaults to.
func (cmd Command) parse(args []string) (replay.Options, flags, error) {
	o := cmd.Options
	var f flags
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(cmd.Stderr)
	fs.StringVar(&f.mode, "mode", string(o.Mode), "normal, rebuild, forensic or repair")
	fs.StringVar(&f.from, "from", "first", "first, an offset or an RFC 3339 time")
	fs.StringVar(&f.to, "to", "tail", "tail, an offset or an RFC 3339 time (fixed when the run starts)")
	fs.StringVar(&o.RunID, "run-id", o.RunID, "resume the interrupted run with this id")
	fs.BoolVar(&f.abandon, "abandon", false, "rebuild: abandon the interrupted online rebuild --run-id (drop its shadow tables)")
	fs.BoolVar(&f.inPlace, "in-place", false, "rebuild: rebuild in place, the live workers paused, instead of beside them")
	fs.Var((*listFlag)(&o.Select.Keys), cmd.KeyFlag, "repair: business keys to re-run, comma-separated")
	fs.Var((*listFlag)(&o.Select.IDs), "id", "repair: message ids to re-run, comma-separated")
	fs.StringVar(&o.Operator, "operator", firstNonEmpty(o.Operator, os.Getenv("USER")), "repair: who runs it, for the audit")
	fs.StringVar(&o.Reason, "reason", o.Reason, "repair: why, for the audit")
	fs.BoolVar(&o.Redispatch, "redispatch", o.Redispatch, "repair: send the failed_terminal and unknown effects of the re-run messages again")
	fs.StringVar(&f.report, "report", "", "forensic: write the JSON-lines report to this file (default stdout)")
	fs.BoolVar(&o.Wait, "wait", o.Wait, "in-place rebuild: wait for the live workers to release the stream instead of failing")
	fs.IntVar(&o.BatchSize, "batch", o.BatchSize, "messages per transaction (default: the consumer's batch size)")
	fs.BoolVar(&o.AllowBelowHorizon, "allow-below-horizon", o.AllowBelowHorizon,
		"normal: start below the inbox horizon, running the handler again on messages retention made the inbox forget")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, f, err
		}
		return o, f, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return o, f, fmt.Errorf("%w: unexpected arguments %q", ErrUsage, fs.Args())
	}
	return o, f, f.apply(&o)
}

// apply sets the options the flags f give.
func (f flags) apply(o *replay.Options) error {
	o.Mode = idem.Mode(f.mode)
	var err error
	if o.From, err = replay.ParsePosition(f.from); err != nil {
		return fmt.Errorf("%w: --from: %v", ErrUsage, err)
	}
	if o.To, err = replay.ParsePosition(f.to); err != nil {
		return fmt.Errorf("%w: --to: %v", ErrUsage, err)
	}
	if o.Mode != idem.Repair {
		o.Operator = "" // the $USER default is for the repair audit only
	}
	switch {
	case o.Mode != idem.Rebuild:
		o.Reset, o.Projection = nil, nil // defaults for when the mode is rebuild
	case f.inPlace:
		o.Projection = nil
	case o.Projection != nil:
		o.Reset = nil // a default for --in-place
	}
	return nil
}

// abandonRun is Main with --abandon.
func abandonRun(ctx context.Context, c *consumer.Consumer, o replay.Options, stderr io.Writer) error {
	if o.Mode != idem.Rebuild || o.RunID == "" {
		return fmt.Errorf("%w: --abandon needs --mode rebuild and the --run-id of the rebuild to abandon", ErrUsage)
	}
	cfg := c.Config()
	if err := replay.Abandon(ctx, cfg.Pool, cfg.Tables, o.RunID); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "rebuild %s abandoned: its shadow tables are dropped; the live projection is untouched\n", o.RunID)
	return nil
}

// ExitCode maps Main's error to a process exit code: 0 for success (or
// --help), 1 when a forensic replay found conflicts, failed handlers or dead letters, 2
// for any other failure (bad arguments included). Cron jobs and CI can tell
// findings from a replay that could not run.
func ExitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, replay.ErrFindings):
		return 1
	default:
		return 2
	}
}

// printSummary writes s for a person.
func printSummary(w io.Writer, s replay.Summary) {
	var b strings.Builder
	fmt.Fprintf(&b, "replay %s of %s", s.Mode, s.Stream)
	if s.RunID != "" {
		fmt.Fprintf(&b, " (run %s", s.RunID)
		if s.Resumed {
			b.WriteString(", resumed")
		}
		b.WriteString(")")
	}
	fmt.Fprintf(&b, ": %d messages", s.Messages)
	if s.Messages > 0 {
		fmt.Fprintf(&b, " (offsets %d to %d)", s.First, s.Last)
	}
	fmt.Fprintf(&b, " in %s\n", s.Elapsed.Round(1e6))
	fmt.Fprintf(&b, "  processed %d, duplicates %d, dead-lettered %d, of which conflicts %d, skipped %d",
		s.Processed, s.Duplicates, s.DeadLettered, s.Conflicts, s.Skipped)
	if s.Mode == idem.Forensic {
		fmt.Fprintf(&b, ", failed and would be retried %d", s.Retried)
	}
	b.WriteString("\n")
	switch s.Mode {
	case idem.Forensic:
		fmt.Fprintf(&b, "  live inbox: new (not processed) %d, duplicate (processed with this payload) %d, "+
			"forgotten by retention %d; effects the handlers would record %d\n", s.InboxNew, s.InboxDuplicate, s.Forgotten, s.Effects)
	case idem.Rebuild:
		if s.CaughtUp > 0 {
			fmt.Fprintf(&b, "  caught up %d messages past the live checkpoint (effects dispatched)\n", s.CaughtUp)
		}
		if s.Swapped {
			fmt.Fprintf(&b, "  swapped: the rebuilt tables replaced the live ones at offset %d (live worker paused %s); "+
				"the live consumer continues after it\n", s.Handoff, s.Pause.Round(time.Millisecond))
		} else if s.HasHandoff {
			fmt.Fprintf(&b, "  hand-off: the live consumer continues after offset %d\n", s.Handoff)
		}
	case idem.Repair:
		if s.Redispatched > 0 {
			fmt.Fprintf(&b, "  effects sent again: %d\n", s.Redispatched)
		}
	}
	_, _ = io.WriteString(w, b.String())
}

// listFlag is a repeatable, comma-separated flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
