// Command idem is the operator's tool: it migrates the schema, inspects the
// inbox, the ledger, the dead letters and the replay runs, resolves effects,
// redrives dead letters and cleans up, all on the tables the library writes.
//
//	idem migrate [--print-sql]
//	idem inbox show --consumer C --id ID | stats | cleanup --older-than 168h [--consumer C]
//	idem ledger list [--status S] | show ID | resolve ID... --as succeeded|failed|retry --reason "…" | stats
//	idem ledger resolve --status unknown --all [--type T] [--consumer C] --as … --reason "…"
//	idem http-keys list [--state S] | show KEY_ID | resolve KEY_ID... --as completed|retry --reason "…"
//	idem http-keys resolve --state unknown --all [--operation O] --as … --reason "…"
//	idem operations list [--state S] | show OPERATION_ID | resolve OPERATION_ID --as succeeded|failed --reason "…"
//	idem deadletters list [--consumer C] [--id ID] [--reason R] | redrive --queue Q [--reason R] [--id ID] [--consumer C] [--limit N]
//	idem deadletters list --group-by reason|consumer,reason [--consumer C]
//	idem replay runs [--consumer C]
//	idem cleanup --older-than 720h [--floor D]
//
// Every command takes --schema S and --prefix P (where idem's tables are;
// IDEM_SCHEMA and IDEM_PREFIX set their defaults), and --help. Durations
// take days too (30d, 7d12h). List, show and stats commands take --json. Flags go before or
// after the arguments (idem ledger show ID --json); -- ends the flags. The database is
// --pg-url, else IDEM_PG_URL, else the libpq environment (PGHOST, PGPORT,
// PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE, …); errors name the host, port
// and database it looked in. The broker, for redrive, is
// --amqp-url, else IDEM_AMQP_URL (a cluster: its node URLs, comma-separated).
//
// Tables and messages show what is not printable escaped, as Go writes it
// (\x1b, \u202e, \x0a): ids, reasons and errors come from producers and
// handlers and can neither steer the terminal nor forge a row. --json
// prints the text as stored.
//
// A resolve acts on the ids it is given, or with --all on every record its
// --status (--state) selects, narrowed by its other filters; a filter
// without --all, or --all without a status, is bad usage. It resolves each
// record in a transaction of its own, with its own audit row, and prints a
// line (or a JSON element) per record: resolved, or refused and why.
// Lists print, on stderr under a full page, the flag that lists the next.
//
// Exit codes: 0 success (and --help), 1 failure (a resolve that refused
// any record), 2 bad usage (an unknown command, subcommand or flag, a bad
// flag value such as --limit -1, a missing required flag, a missing or
// extra argument).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
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
	"github.com/idemkit/idem/pgnodes"
)

// command is one `idem NAME …` command; each is implemented in a file of
// its own and listed in commands.
type command struct {
	summary string
	// subcommands lists a group's subcommands (inbox show, inbox stats, …),
	// for the usage text and the tests; empty for a plain command.
	subcommands []string
	run         func(ctx context.Context, env *env, args []string) error
}

// commands is every command, by name.
var commands = map[string]command{
	"cleanup": {summary: "delete what idem no longer needs from every table, never below the floor", run: runCleanup},
	"console": {summary: "serve the operator console (loopback only without --token or --basic-auth)", run: runConsole},
	"deadletters": {summary: "list dead letters, or move them back to their queue",
		subcommands: []string{"list", "redrive"}, run: runDeadLetters},
	"http-keys": {summary: "list, show and resolve HTTP idempotency keys (and webhook events, bulk items)",
		subcommands: []string{"list", "show", "resolve"}, run: runHTTPKeys},
	"inbox": {summary: "show an inbox row, per-consumer stats, or clean up expired rows",
		subcommands: []string{"show", "stats", "horizon", "cleanup"}, run: runInbox},
	"ledger": {summary: "list, show, resolve and count side effects",
		subcommands: []string{"list", "show", "resolve", "stats"}, run: runLedger},
	"migrate": {summary: "apply idem's schema, or print it (--print-sql)", run: runMigrate},
	"operations": {summary: "list, show and resolve long-running operations of the HTTP edge",
		subcommands: []string{"list", "show", "resolve"}, run: runOperations},
	"replay": {summary: "list replay runs; abandon an interrupted online rebuild",
		subcommands: []string{"runs", "abandon"}, run: runReplay},
}

// env is what every command gets: where to write and how to reach the
// database.
type env struct {
	stdout io.Writer
	stderr io.Writer
	// pgURL is --pg-url; pgEnv is IDEM_PG_URL, used when pgURL is empty.
	// Neither is ever a flag default, so --help never prints a password.
	pgURL, pgEnv string
	// database names the database pool connected to (host, port, name and
	// where the URL came from), for errors; "" until then.
	database string
	tables   idem.Tables
	json     bool
	// operator is --operator of the command that has one, filled with the
	// OS user after parsing when not given.
	operator *string
	// groupUsage is the usage text of the command group being run, whose
	// lines give a subcommand's synopsis in its --help.
	groupUsage string
}

// flags returns a FlagSet with the options every command shares bound to e.
func (e *env) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.StringVar(&e.pgURL, "pg-url", "", "PostgreSQL URL (default: $IDEM_PG_URL, else the PG* environment and libpq's defaults)")
	fs.StringVar(&e.tables.Schema, "schema", e.tables.Schema, "schema holding idem's tables ($IDEM_SCHEMA sets the default)")
	fs.StringVar(&e.tables.Prefix, "prefix", e.tables.Prefix, "table name prefix ($IDEM_PREFIX sets the default)")
	fs.Usage = func() { e.printUsage(fs, name) }
	return fs
}

// printUsage prints the synopsis of command name (its lines of the group's
// usage text, with their positional arguments) and its flags.
func (e *env) printUsage(fs *flag.FlagSet, name string) {
	w := fs.Output()
	synopsis := "usage: idem " + name + " [flags]"
	var lines []string
	for _, l := range strings.Split(e.groupUsage, "\n") {
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "idem "+name+" ") || t == "idem "+name {
			lines = append(lines, t)
		}
	}
	if len(lines) > 0 {
		synopsis = "usage: " + strings.Join(lines, "\n       ")
	}
	fmt.Fprintf(w, "%s\n\nflags:\n", synopsis)
	fs.PrintDefaults()
}

// operatorFlag defines --operator, who acts, for the audit trail; the OS
// user when it is not given.
func (e *env) operatorFlag(fs *flag.FlagSet, usage string) *string {
	e.operator = new(string)
	fs.StringVar(e.operator, "operator", "", usage+" (default: the OS user)")
	return e.operator
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

// errConnect marks a failure to connect; its error names the database.
var errConnect = errors.New("connect")

// databaseURL returns the URL to connect to and where it came from:
// --pg-url, IDEM_PG_URL, else "", which makes pgx read the libpq
// environment (PGHOST, PGDATABASE, …) and libpq's defaults, as psql does.
func (e *env) databaseURL() (url, from string) {
	switch {
	case e.pgURL != "":
		return e.pgURL, "--pg-url"
	case e.pgEnv != "":
		return e.pgEnv, "IDEM_PG_URL"
	}
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") {
			return "", "the PG* environment"
		}
	}
	return "", "libpq's defaults: no --pg-url, IDEM_PG_URL or PG* variable is set"
}

// pool connects to the database databaseURL names. Its errors, and the
// later errors of a lost connection, name the host, port and database.
func (e *env) pool(ctx context.Context) (*pgxpool.Pool, error) {
	url, from := e.databaseURL()
	// An empty URL makes pgx read PGHOST, PGPORT, PGUSER, … like libpq.
	// pgnodes bounds each host of a multi-host URL: a host that stops
	// answering costs seconds, then the next one is tried.
	cfg, err := pgnodes.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("connect (URL from %s): %w", from, err) // pgx redacts the password
	}
	c := cfg.ConnConfig
	// Without a database name the server takes the user's name.
	e.database = fmt.Sprintf("database %q on %s:%d (from %s)", cmp.Or(c.Database, c.User), c.Host, c.Port, from)
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w to %s: %w", errConnect, e.database, err)
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("%w to %s: %w", errConnect, e.database, err)
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
		tables: idem.Tables{Schema: cmp.Or(os.Getenv("IDEM_SCHEMA"), idem.DefaultSchema),
			Prefix: cmp.Or(os.Getenv("IDEM_PREFIX"), idem.DefaultPrefix)},
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
		fmt.Fprintf(stderr, "idem %s: %s\n", args[0], safetext.Display(err.Error()))
		return 2
	}
	fmt.Fprintf(stderr, "idem %s: %s\n", args[0], safetext.Display(e.explain(err).Error()))
	return 1
}

// explain adds what to do to errors an operator can fix: idem's tables or
// schema missing (SQLSTATE 42P01, 3F000) means the schema was not
// migrated, or that idem looks in the wrong database; a connection lost
// after connecting names the database.
func (e *env) explain(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || (pe.Code != "42P01" && pe.Code != "3F000") {
		if e.database != "" && !errors.Is(err, errConnect) && lostConnection(err) {
			return fmt.Errorf("%s: %w", e.database, err)
		}
		return err
	}
	t := e.tables.WithDefaults()
	cmd := "idem migrate --schema " + shellQuote(t.Schema)
	if t.Prefix != idem.DefaultPrefix {
		cmd += " --prefix " + shellQuote(t.Prefix)
	}
	return fmt.Errorf("idem's tables are missing in schema %q of %s (%s): if they are in another database, point idem at it (--pg-url or IDEM_PG_URL); to create them here, run `%s`",
		t.Schema, e.database, pe.Message, cmd)
}

// lostConnection reports whether err is the loss of a database connection
// (a network error, a server that went away, SQLSTATE class 08 or 57P).
func lostConnection(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P")
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || pgconn.Timeout(err)
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
	e.groupUsage = text
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
