package console_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/console"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/ledger"
)

// fixture is one test's schema, and a queue with its dead-letter queue.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	tables idem.Tables
	queue  string
	ch     *amqp.Channel
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool, tables := testdb.Schema(t)
	return &fixture{t: t, pool: pool, tables: tables}
}

// withQueue declares a queue and its dead-letter queue on the test broker.
func (f *fixture) withQueue() *fixture {
	f.t.Helper()
	f.queue, f.ch = testbroker.Queue(f.t), testbroker.Channel(f.t)
	for _, q := range []string{f.queue, f.queue + ".dlq"} {
		_, err := f.ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(f.t, err)
	}
	return f
}

// deadLetter writes a dead-letter row of consumer for message id, as the
// consumer does, and, with a queue, publishes its copy to the dead-letter
// queue. It returns the row's id.
func (f *fixture) deadLetter(consumer, id, reason string, payload []byte) int64 {
	f.t.Helper()
	body := []byte(`{"id":"` + hex.EncodeToString([]byte(id)) + `"}`)
	h := sha256.Sum256(body)
	var row int64
	err := f.pool.QueryRow(context.Background(), "INSERT INTO "+f.tables.Table("dead_letters")+
		` (consumer, message_id, payload_hash, reason, error, source, attempts, payload)
		VALUES ($1, $2, $3, $4, $5, $6, 3, $7) RETURNING id`,
		consumer, id, h[:], reason, "boom \x1b[31mred\x1b[0m <b>bold</b>", f.queue, payload).Scan(&row)
	require.NoError(f.t, err)
	if f.ch == nil {
		return row
	}
	err = f.ch.PublishWithContext(context.Background(), "", f.queue+".dlq", false, false, amqp.Publishing{
		MessageId: id, Body: body, DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{"x-idem-reason": reason, "x-idem-error": "boom", "x-idem-consumer": consumer,
			"x-idem-attempts": int64(3), "x-idem-message-id": id, "x-idem-payload-hash": hex.EncodeToString(h[:])},
	})
	require.NoError(f.t, err)
	require.Eventually(f.t, func() bool {
		q, err := f.ch.QueueDeclarePassive(f.queue+".dlq", true, false, false, false, nil)
		return err == nil && q.Messages > 0
	}, 10*time.Second, 20*time.Millisecond)
	return row
}

// effect records an effect of type mail for key and moves it to status.
func (f *fixture) effect(key string, status ledger.Status) string {
	f.t.Helper()
	ctx := context.Background()
	l, err := ledger.New(ledger.Config{Pool: f.pool, Tables: f.tables})
	require.NoError(f.t, err)
	var id string
	require.NoError(f.t, pgx.BeginFunc(ctx, f.pool, func(tx pgx.Tx) error {
		e, err := l.Record(ctx, tx, ledger.Effect{Type: "mail", BusinessKey: key, Target: "https://mail.example/send",
			Request: map[string]string{"to": "secret-address@example.com"}, Consumer: "billing", MessageID: "m-" + key})
		id = e.ID
		return err
	}))
	_, err = f.pool.Exec(ctx, "UPDATE "+f.tables.Table("ledger")+
		" SET status = $2, last_error = 'gateway said 502', attempt_count = 1 WHERE effect_id = $1", id, string(status))
	require.NoError(f.t, err)
	return id
}

// serve runs a console for cfg (Pool and Tables filled in) on a loopback
// test server.
func (f *fixture) serve(cfg console.Config) *client {
	f.t.Helper()
	cfg.Pool, cfg.Tables = f.pool, f.tables
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if f.queue != "" && cfg.AMQPURLs == nil {
		cfg.AMQPURLs = []string{testbroker.URL()}
	}
	c, err := console.New(cfg)
	require.NoError(f.t, err)
	srv := httptest.NewServer(c)
	f.t.Cleanup(func() { srv.Close(); c.Close() })
	jar, err := cookiejar.New(nil)
	require.NoError(f.t, err)
	return &client{t: f.t, base: srv.URL, http: &http.Client{Jar: jar, Timeout: time.Minute,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// client is a browser without script: cookies, and forms with their CSRF
// token.
type client struct {
	t          *testing.T
	base       string
	http       *http.Client
	user, pass string // basic auth, when set
	header     http.Header
	csrf       string
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (c *client) do(req *http.Request) (int, string, http.Header) {
	c.t.Helper()
	if c.user != "" {
		req.SetBasicAuth(c.user, c.pass)
	}
	for k, v := range c.header {
		req.Header[k] = v
	}
	resp, err := c.http.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	if m := csrfRE.FindSubmatch(b); m != nil {
		c.csrf = string(m[1])
	}
	return resp.StatusCode, string(b), resp.Header
}

// get requests path.
func (c *client) get(path string) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.base+path, nil)
	require.NoError(c.t, err)
	code, body, _ := c.do(req)
	return code, body
}

// post submits form to path with the CSRF token of the last page read.
func (c *client) post(path string, form url.Values) (int, string) {
	c.t.Helper()
	if form.Get("csrf") == "" && c.csrf != "" {
		form.Set("csrf", c.csrf)
	}
	req, err := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	require.NoError(c.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	code, body, _ := c.do(req)
	return code, body
}

// audit returns the ledger audit rows of effect id as "operator: from -> to: reason".
func (f *fixture) audit(id string) []string {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), "SELECT operator || ': ' || from_status || ' -> ' || to_status || ': ' || reason FROM "+
		f.tables.Table("ledger_audit")+" WHERE effect_id = $1 ORDER BY id", id)
	require.NoError(f.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(f.t, err)
	return out
}

// status is an effect's status.
func (f *fixture) status(id string) string {
	f.t.Helper()
	var s string
	require.NoError(f.t, f.pool.QueryRow(context.Background(), "SELECT status FROM "+f.tables.Table("ledger")+
		" WHERE effect_id = $1", id).Scan(&s))
	return s
}

// redrivenBy is the redriven_by of dead-letter row id; "" while not
// settled.
func (f *fixture) redrivenBy(id int64) string {
	f.t.Helper()
	var by *string
	require.NoError(f.t, f.pool.QueryRow(context.Background(), "SELECT CASE WHEN redriven_at IS NOT NULL THEN coalesce(redriven_by, '?') END FROM "+
		f.tables.Table("dead_letters")+" WHERE id = $1", id).Scan(&by))
	if by == nil {
		return ""
	}
	return *by
}
