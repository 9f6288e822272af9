// Command idem is the operator's tool: it migrates the schema and inspects
// the inbox, the ledger and the dead letters, all from the same tables the
// library writes.
//
//	idem migrate [--print-sql] [--schema S] [--prefix P]
//	idem inbox show --consumer C --id ID
//	idem inbox stats
//	idem inbox cleanup --older-than 168h [--consumer C]
//	idem ledger list [--status unknown] | show ID | resolve ID --as succeeded|failed|retry --reason "…" | stats
//	idem deadletters list [--consumer C] [--id ID] [--reason R]
//
// Every command reads IDEM_PG_URL (or --pg-url) for the database.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// command is one `idem NAME …` subcommand. Files in this package register
// theirs from init, one file per command.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *env, args []string) error
}

var commands = map[string]command{}

func register(c command) { commands[c.name] = c }

// env is what every command gets: where to write and how to reach the database.
type env struct {
	stdout io.Writer
	stderr io.Writer
	pgURL  string
	tables idem.Tables
}

// flags returns a FlagSet with the options every command shares bound to e.
func (e *env) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.StringVar(&e.pgURL, "pg-url", e.pgURL, "PostgreSQL URL (env IDEM_PG_URL)")
	fs.StringVar(&e.tables.Schema, "schema", e.tables.Schema, "schema holding idem's tables")
	fs.StringVar(&e.tables.Prefix, "prefix", e.tables.Prefix, "table name prefix")
	return fs
}

// pool connects to the database named by the flags.
func (e *env) pool(ctx context.Context) (*pgxpool.Pool, error) {
	if err := e.tables.Validate(); err != nil {
		return nil, err
	}
	p, err := pgxpool.New(ctx, e.pgURL)
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

// errUsage marks errors that should print the usage text; exit code 2.
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{
		stdout: stdout,
		stderr: stderr,
		pgURL:  os.Getenv("IDEM_PG_URL"),
		tables: idem.Tables{Schema: idem.DefaultSchema, Prefix: idem.DefaultPrefix},
	}
	if e.pgURL == "" {
		e.pgURL = "postgres://root@127.0.0.1:5432/test?sslmode=disable"
	}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stderr)
		return 2
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "idem: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	if err := c.run(ctx, e, args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 2
		}
		fmt.Fprintf(stderr, "idem %s: %v\n", c.name, err)
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: idem COMMAND [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'idem COMMAND -h' for a command's flags. IDEM_PG_URL sets the database.")
}
