// Package replaycmd is the "replay" subcommand a worker binary adds beside
// its worker: it parses the command line into replay.Options, runs the
// replay (package replay) with the worker's stream consumer, prints a
// summary, and maps the outcome to an exit code. It is a package of its own
// so that the library (package replay) holds no command line.
//
// # A worker binary with a replay subcommand
//
// The worker builds its stream consumer (a consumer.Consumer with a
// Config.Stream) once and either runs it or, for the "replay" subcommand,
// hands it to Main:
//
//	switch args[0] {
//	case "worker":
//		return c.Run(ctx)
//	case "replay":
//		return replaycmd.Main(ctx, c, args[1:], replaycmd.Command{Options: replay.Options{Projection: overview}})
//	}
//
// and exits with ExitCode(err): 0 on success (and for --help), 1 when a
// forensic replay found conflicts, failed handlers or dead letters, 2 when the replay could
// not run (bad arguments included, ErrUsage). Cron jobs and CI can tell
// findings from a replay that could not run.
//
// # Flags
//
// --mode (normal, rebuild, forensic or repair) is required; --from and --to
// take first, tail, an offset or an RFC 3339 time; --run-id resumes an
// interrupted run, and with --abandon gives up an online rebuild. A repair
// selects its messages with --id or --key (Command.KeyFlag renames it, as
// the orders example's --order), and records --operator and --reason. A
// forensic replay writes its JSON-lines report to --report or to
// Command.Stdout. Progress and the summary go to Command.Stderr. Options
// that have no flag (a Projection, a Reset hook, a Logger) are set in
// Command.Options, which the flags override.
//
// The streams guide (docs/streams.md) shows each mode at work.
package replaycmd
