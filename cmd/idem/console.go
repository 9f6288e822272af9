package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/console"
)

const consoleUsage = `usage:
  idem console [--addr 127.0.0.1:8080] [--read-only] [--show-payloads] [--amqp-url URL]
               [--token NAME:TOKEN]... [--basic-auth USER:PASSWORD]... [--queue Q]... [--base-path /console]
      serves the operator console until interrupted. Without --token or --basic-auth it listens on
      loopback only and acts as the OS user; beyond loopback it refuses to start without them.
      IDEM_CONSOLE_TOKENS and IDEM_CONSOLE_BASIC_AUTH take the same NAME:SECRET pairs, separated by
      commas, and keep the secrets out of the process list.`

// secrets is a repeatable NAME:SECRET flag.
type secrets map[string]string

func (s secrets) String() string { return "" } // never print a secret

func (s secrets) Set(v string) error {
	name, secret, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" || secret == "" {
		return errors.New("want NAME:SECRET")
	}
	s[name] = secret
	return nil
}

// list is a repeatable flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

// consoleServeTimeout bounds reading a request's headers and writing an
// answer (an action may take up to the console's ActionTimeout).
const consoleServeTimeout = console.DefaultActionTimeout + 30*time.Second

func runConsole(ctx context.Context, e *env, args []string) error {
	fs := e.flags("console")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "%s\n\nflags:\n", consoleUsage)
		fs.PrintDefaults()
	}
	addr := fs.String("addr", "127.0.0.1:8080", "where to listen; beyond loopback only with --token or --basic-auth")
	amqpURL := fs.String("amqp-url", "", "RabbitMQ URL, or a cluster's node URLs separated by commas, for queue depths and redrive (default: $IDEM_AMQP_URL)")
	basePath := fs.String("base-path", "", "the path the console answers under, behind a proxy (e.g. /console)")
	cfg := console.Config{Tokens: secrets{}, BasicAuth: secrets{}}
	fs.Var(secrets(cfg.Tokens), "token", "an operator who signs in with a token: `NAME:TOKEN` (repeatable; $IDEM_CONSOLE_TOKENS)")
	fs.Var(secrets(cfg.BasicAuth), "basic-auth", "an operator who signs in with a password: `USER:PASSWORD` (repeatable; $IDEM_CONSOLE_BASIC_AUTH)")
	fs.BoolVar(&cfg.ReadOnly, "read-only", false, "show everything, act on nothing: no forms, every POST refused")
	fs.BoolVar(&cfg.ShowPayloads, "show-payloads", false, "let operators reveal payloads and stored bodies, one at a time (default: never shown)")
	fs.Var((*list)(&cfg.Queues), "queue", "a queue `Q` whose depth the overview always shows (repeatable)")
	if err := e.parse(fs, args); err != nil {
		return err
	}
	if err := consoleEnv(cfg); err != nil {
		return err
	}
	if len(cfg.Tokens) == 0 && len(cfg.BasicAuth) == 0 && !console.LoopbackAddr(*addr) {
		return fmt.Errorf("%w: refusing to listen on %s without authentication: it is beyond loopback. Pass --token NAME:TOKEN "+
			"or --basic-auth USER:PASSWORD (or IDEM_CONSOLE_TOKENS, IDEM_CONSOLE_BASIC_AUTH), or listen on 127.0.0.1", errUsage, *addr)
	}
	urls := *amqpURL
	if urls == "" {
		urls = os.Getenv("IDEM_AMQP_URL")
	}
	if urls != "" {
		var err error
		if cfg.AMQPURLs, err = amqpnodes.Split(urls); err != nil {
			return fmt.Errorf("%w: --amqp-url or IDEM_AMQP_URL: %w", errUsage, err)
		}
	}
	pool, err := e.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg.Pool, cfg.Tables, cfg.Prefix = pool, e.tables, *basePath
	cfg.Logger = slog.New(slog.NewTextHandler(e.stderr, nil))
	c, err := console.New(cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	defer c.Close()
	return serveConsole(ctx, e, c, *addr, cfg)
}

// consoleEnv adds the NAME:SECRET pairs of IDEM_CONSOLE_TOKENS and
// IDEM_CONSOLE_BASIC_AUTH.
func consoleEnv(cfg console.Config) error {
	for name, into := range map[string]secrets{"IDEM_CONSOLE_TOKENS": cfg.Tokens, "IDEM_CONSOLE_BASIC_AUTH": cfg.BasicAuth} {
		for _, pair := range strings.Split(os.Getenv(name), ",") {
			if strings.TrimSpace(pair) == "" {
				continue
			}
			if err := into.Set(strings.TrimSpace(pair)); err != nil {
				return fmt.Errorf("%w: %s: %w", errUsage, name, err)
			}
		}
	}
	return nil
}

// serveConsole listens on addr and serves c until ctx ends.
func serveConsole(ctx context.Context, e *env, c *console.Console, addr string, cfg console.Config) error {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: consoleServeTimeout,
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}
	who := "as " + currentUser() + ", loopback only"
	if len(cfg.Tokens)+len(cfg.BasicAuth) > 0 {
		who = "for the operators who sign in"
	}
	mode := ""
	if cfg.ReadOnly {
		mode = ", read-only"
	}
	e.printf("idem console: schema %s on http://%s%s/ (%s%s)\n", e.tables.WithDefaults().Schema, ln.Addr(), cfg.Prefix, who, mode)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }() // owned here: Shutdown below ends it
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		_ = srv.Close()
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
