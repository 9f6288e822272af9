// Command idem is the operator's tool: it migrates the schema, inspects the
// inbox, the ledger, the dead letters and the replay runs, resolves effects,
// redrives dead letters and cleans up, all on the tables the library writes.
//
//	idem migrate [--print-sql]
//	idem inbox show --consumer C --id ID | stats | cleanup --older-than 168h [--consumer C]
//	idem ledger list [--status S] | show ID | resolve ID --as succeeded|failed|retry --reason "…" | stats
//	idem http-keys list [--state S] | show KEY_ID | resolve KEY_ID --as completed|retry --reason "…"
//	idem operations list [--state S] | show OPERATION_ID | resolve OPERATION_ID --as succeeded|failed --reason "…"
//	idem deadletters list [--consumer C] [--id ID] [--reason R] | redrive --queue Q [--reason R] [--id ID] [--consumer C] [--limit N]
//	idem replay runs [--consumer C]
//	idem cleanup --older-than 720h [--floor D]
//
// Every command takes --schema S and --prefix P (where idem's tables are),
// and --help. List, show and stats commands take --json. Flags go before or
// after the arguments (idem ledger show ID --json); -- ends the flags. The database is
// --pg-url, else IDEM_PG_URL, else the libpq environment (PGHOST, PGPORT,
// PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE, …); the broker, for redrive, is
// --amqp-url, else IDEM_AMQP_URL (a cluster: its node URLs, comma-separated).
//
// Tables and messages show what is not printable escaped, as Go writes it
// (\x1b, \u202e, \x0a): ids, reasons and errors come from producers and
// handlers and can neither steer the terminal nor forge a row. --json
// prints the text as stored.
//
// Exit codes: 0 success (and --help), 1 failure, 2 bad usage (an unknown
// command, subcommand or flag, a bad flag value such as --limit -1, a
// missing required flag, a missing or extra argument).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/safetext"
)

// command is one `idem NAME …` command. Files in this package register
// theirs from init, one file per command.
type command struct {
	name    string
	summary string
	// subcommands lists a group's subcommands (inbox show, inbox stats, …),
	// for the usage text and the tests; empty for a plain command.
	subcommands []string
	run         func(ctx context.Context, env *env, args []string) error
}

var commands = map[string]command{}

func register(c command) { commands[c.name] = c }

// env is what every command gets: where to write and how to reach the
// database.
type env struct {
	stdout io.Writer
	stderr io.Writer
	// pgURL is --pg-url; pgEnv is IDEM_PG_URL, used when pgURL is empty.
	// Neither is ever a flag default, so --help never prints a password.
	pgURL, pgEnv string
	tables       idem.Tables
	json         bool
}

// flags returns a FlagSet with the options every command shares bound to e.
func (e *env) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.StringVar(&e.pgURL, "pg-url", "", "PostgreSQL URL (default: $IDEM_PG_URL, else the PG* environment)")
	fs.StringVar(&e.tables.Schema, "schema", e.tables.Schema, "schema holding idem's tables")
	fs.StringVar(&e.tables.Prefix, "prefix", e.tables.Prefix, "table name prefix")
	return fs
}

// jsonFlag adds --json to fs.
func (e *env) jsonFlag(fs *flag.FlagSet) {
	fs.BoolVar(&e.json, "json", false, "print JSON instead of a table")
}

// wantsHelp reports whether args ask for help before any "--".
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help", "help":
			return true
		}
	}
	return false
}

// pool connects to the database named by --pg-url, IDEM_PG_URL or the
// libpq environment, in that order.
func (e *env) pool(ctx context.Context) (*pgxpool.Pool, error) {
	url := e.pgURL
	if url == "" {
		url = e.pgEnv
	}
	// An empty URL makes pgx read PGHOST, PGPORT, PGUSER, … like libpq.
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("connect: %w", err)
	}
	return p, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// errUsage marks bad usage: an unknown command, subcommand or flag, a bad
// flag value, a missing or extra argument. It exits 2.
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{
		stdout: stdout,
		stderr: stderr,
		pgEnv:  os.Getenv("IDEM_PG_URL"),
		tables: idem.Tables{Schema: idem.DefaultSchema, Prefix: idem.DefaultPrefix},
	}
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(stdout)
		return 0
	case "help":
		if len(args) == 1 || strings.HasPrefix(args[1], "-") {
			usage(stdout)
			return 0
		}
		args = []string{args[1], "--help"} // idem help inbox = idem inbox --help
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "idem: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	err := c.run(ctx, e, args[1:])
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "idem %s: %s\n", c.name, safetext.Display(err.Error()))
		return 2
	}
	fmt.Fprintf(stderr, "idem %s: %s\n", c.name, safetext.Display(explain(err, e.tables).Error()))
	return 1
}

// explain adds what to do to errors an operator can fix: idem's tables or
// schema missing (SQLSTATE 42P01, 3F000) means the schema was not migrated.
func explain(err error, t idem.Tables) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || (pe.Code != "42P01" && pe.Code != "3F000") {
		return err
	}
	t = t.WithDefaults()
	cmd := "idem migrate --schema " + shellQuote(t.Schema)
	if t.Prefix != idem.DefaultPrefix {
		cmd += " --prefix " + shellQuote(t.Prefix)
	}
	return fmt.Errorf("idem's tables are missing in schema %q (%s): create them with `%s`", t.Schema, pe.Message, cmd)
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '_' || r == '-' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// group runs a command with subcommands: args[0] names the subcommand; a
// help flag or "help" prints text and exits 0, a missing or unknown
// subcommand prints it and exits 2.
func group(e *env, text string, args []string, subs map[string]func([]string) error) error {
	if len(args) == 0 {
		fmt.Fprintln(e.stderr, text)
		return fmt.Errorf("%w: missing subcommand", errUsage)
	}
	if f, ok := subs[args[0]]; ok {
		return f(args[1:])
	}
	if wantsHelp(args[:1]) {
		fmt.Fprintln(e.stdout, text)
		return flag.ErrHelp
	}
	fmt.Fprintln(e.stderr, text)
	return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: idem COMMAND [SUBCOMMAND] [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c := commands[n]
		sub := ""
		if len(c.subcommands) > 0 {
			sub = " (" + strings.Join(slices.Sorted(slices.Values(c.subcommands)), "|") + ")"
		}
		fmt.Fprintf(w, "  %-12s %s%s\n", n, c.summary, sub)
	}
	fmt.Fprintln(w, `
Run 'idem COMMAND --help' for a command's flags. The database is --pg-url,
else IDEM_PG_URL, else the PG* environment (PGHOST, PGPORT, PGUSER,
PGPASSWORD, PGDATABASE, PGSSLMODE). The broker, for redrive, is --amqp-url,
else IDEM_AMQP_URL: one URL, or a cluster's node URLs separated by commas.`)
}
