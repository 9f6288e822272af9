package console

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/user"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/health"
)

// Config configures a Console. Pool is required; everything else has a
// default that is safe: no broker, no payloads, loopback only.
type Config struct {
	// ActionTimeout bounds one action (a redrive, a resolve of many
	// effects): what it did not reach by then stays as it was, and the page
	// says so. Default: 2 minutes.
	ActionTimeout time.Duration
	// AMQPURLs are the broker's nodes, one URL each: the overview reads the
	// depth of the queues, retry queues and dead-letter queues there
	// (passive declares, a few seconds at most; a broker that does not
	// answer is shown, not fatal), and redrive moves messages there.
	// Default: none: no depths, and redrive is refused.
	AMQPURLs []string
	// Authenticate authenticates a request with your own scheme (a session
	// of your application, a header set by a proxy you trust): it returns
	// who the operator is, for the audit trail, and whether the request may
	// enter. It is asked before Tokens and BasicAuth. Default: none.
	Authenticate func(r *http.Request) (operator string, ok bool)
	// BasicAuth are the operators who may sign in with HTTP basic
	// authentication: user name (the operator the audit trail records) →
	// password. Default: none.
	BasicAuth map[string]string
	// Health are the components whose readiness the overview shows, when
	// the console runs inside the worker (the consumer, the dispatcher).
	// Default: none.
	Health []health.Reporter
	// Logger receives a line for every action, with the operator and the
	// reason. Default: slog.Default().
	Logger *slog.Logger
	// Operator is who acts when no authentication is configured, which the
	// console allows only on loopback. Default: the OS user running the
	// process.
	Operator string
	// Pool is the database holding idem's tables. Required.
	Pool *pgxpool.Pool
	// Prefix is the path the console is mounted at, such as "/console",
	// without a trailing slash: mount it with mux.Handle("/console/", c).
	// Default: "" (the root).
	Prefix string
	// Queues are queues whose depth the overview always shows, beside those
	// it finds in recent inbox rows and dead letters. Default: none.
	Queues []string
	// ReadOnly hides every action and refuses every POST but signing in.
	// Default: false.
	ReadOnly bool
	// ShowPayloads lets an operator reveal the payload of a dead letter and
	// the request, response and body an effect or an HTTP key stores, one
	// at a time. Default: false: they are never sent to the browser.
	ShowPayloads bool
	// Tables says where idem's tables are. Default: idem's defaults.
	Tables idem.Tables
	// Tokens are the operators who may sign in with a bearer token: name
	// (the operator the audit trail records) → token. A browser signs in
	// once on the console's sign-in page; a script sends
	// "Authorization: Bearer TOKEN". Default: none.
	Tokens map[string]string
}

// Default values of Config.
const (
	DefaultActionTimeout = 2 * time.Minute
)

func (c Config) withDefaults() Config {
	if c.ActionTimeout <= 0 {
		c.ActionTimeout = DefaultActionTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Operator == "" {
		c.Operator = osUser()
	}
	c.Prefix = strings.TrimRight(c.Prefix, "/")
	c.Tables = c.Tables.WithDefaults()
	return c
}

// validate reports what in c the console cannot use.
func (c Config) validate() error {
	switch {
	case c.Pool == nil:
		return fmt.Errorf("console: %w: Pool is required", idem.ErrConfig)
	case c.Prefix != "" && !strings.HasPrefix(c.Prefix, "/"):
		return fmt.Errorf("console: %w: Prefix %q must start with /", idem.ErrConfig, c.Prefix)
	}
	for name, secret := range c.Tokens {
		if strings.TrimSpace(name) == "" || len(secret) < minSecret {
			return fmt.Errorf("console: %w: a token needs an operator name and at least %d characters", idem.ErrConfig, minSecret)
		}
	}
	for name, secret := range c.BasicAuth {
		if strings.TrimSpace(name) == "" || strings.Contains(name, ":") || secret == "" {
			return fmt.Errorf("console: %w: a basic-auth user needs a name without a colon and a password", idem.ErrConfig)
		}
	}
	if err := c.Tables.Validate(); err != nil {
		return fmt.Errorf("console: %w", err)
	}
	return nil
}

// minSecret is the shortest token accepted: a token is guessed over the
// network, so it must not be a word.
const minSecret = 16

// authenticated reports whether c configures any authentication.
func (c Config) authenticated() bool {
	return c.Authenticate != nil || len(c.BasicAuth) > 0 || len(c.Tokens) > 0
}

// Console is the operator console: an http.Handler serving its screens.
// Create it with New; it is safe for concurrent use.
type Console struct {
	cfg     Config
	mux     *http.ServeMux
	pages   *pages
	store   *store
	broker  *brokerProbe
	key     []byte // signs sessions and CSRF tokens; new for each Console
	cop     *http.CrossOriginProtection
	ctx     context.Context // ends with Close: the broker probes' parent
	cancel  context.CancelFunc
	closing sync.Once
}

// New returns the console for cfg, or an error wrapping idem.ErrConfig.
func New(cfg Config) (*Console, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	st, err := newStore(cfg)
	if err != nil {
		return nil, err
	}
	pg, err := parsePages()
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	c := &Console{cfg: cfg, pages: pg, store: st, key: make([]byte, 32), cop: http.NewCrossOriginProtection()}
	if _, err := rand.Read(c.key); err != nil {
		return nil, fmt.Errorf("console: session key: %w", err)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.broker = newBrokerProbe(c.ctx, cfg.AMQPURLs)
	c.cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.refuse(w, r, http.StatusForbidden, "cross-origin request refused: the console acts only on its own forms")
	}))
	c.routes()
	return c, nil
}

// Close stops what the console runs in the background (a broker probe in
// progress). Requests still served afterwards work, without queue depths.
func (c *Console) Close() {
	c.closing.Do(c.cancel)
}

// ServeHTTP serves the console's screens under Config.Prefix.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	secure(w.Header())
	path, ok := strings.CutPrefix(r.URL.Path, c.cfg.Prefix)
	if !ok || (path != "" && path[0] != '/') {
		http.NotFound(w, r)
		return
	}
	if path == "" {
		http.Redirect(w, r, c.cfg.Prefix+"/", http.StatusFound)
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = path
	r2.URL.RawPath = ""
	c.mux.ServeHTTP(w, r2)
}

// routes lists the screens and actions. Every route but the stylesheet and
// the sign-in page goes through guard (authentication, CSRF, read-only).
func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /static/console.css", serveCSS)
	m.HandleFunc("GET /login", c.loginPage)
	m.HandleFunc("POST /login", c.login)
	get := func(pattern string, h handler) { m.Handle("GET "+pattern, c.guard(h)) }
	post := func(pattern string, h handler) { m.Handle("POST "+pattern, c.guard(h)) }
	get("/{$}", c.overview)
	get("/deadletters", c.deadLetters)
	get("/deadletters/{id}", c.deadLetter)
	post("/deadletters/redrive", c.redrive)
	post("/deadletters/discard", c.discard)
	get("/ledger", c.ledger)
	get("/ledger/effect", c.effect)
	post("/ledger/resolve", c.resolveEffects)
	get("/http", c.httpEdge)
	get("/http/key", c.httpKey)
	post("/http/key/resolve", c.resolveKey)
	get("/http/operation", c.httpOperation)
	post("/http/operation/resolve", c.resolveOperation)
	get("/replays", c.replays)
	post("/replays/abandon", c.abandonRun)
	get("/partitions", c.partitions)
	m.Handle("/", c.guard(func(w http.ResponseWriter, r *http.Request, _ *session) {
		c.refuse(w, r, http.StatusNotFound, "no such page")
	}))
	c.mux = m
}

// osUser is the name of the OS user running the process.
func osUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "console"
}
