//go:build browser

package console_test

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/console"
	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/partitions"
)

// The console in a real browser, headless Chromium driven over the
// DevTools protocol, on data a real consumer and a real dispatcher made:
// messages a handler dead-letters (one of them with markup for an id), a
// payment whose gateway answers 502, so that its outcome is unknown, and a
// partitioned consumer holding its partitions. The operator redrives a dead
// letter and resolves the unknown effect through the pages; the database
// and the audit trail show it done, as the signed-in operator.

// xssID is a message id that would run a script if a page let it be markup.
const xssID = `<img src=x onerror=alert(1)>`

// screenshots is where the screens' pictures go, for docs/console.md.
const screenshots = "../docs/console"

// chromium returns the browser to drive: IDEM_CHROMIUM, else Debian's.
// Missing, the test is skipped, except under CI=true where it fails.
func chromium(t *testing.T) string {
	path := os.Getenv("IDEM_CHROMIUM")
	if path == "" {
		path = "/usr/bin/chromium"
	}
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no chromium at %s (CI=true: the browser test must run): ./scripts/services.sh --chromium installs it", path)
		}
		t.Skipf("no chromium at %s: ./scripts/services.sh --chromium installs it", path)
	}
	return path
}

// world is the data the pages show, made by real workers.
type world struct {
	*fixture
	fixed      atomic.Bool // the handler's bug is fixed: refunds apply
	health     []health.Reporter
	refund     int64 // the dead-letter row of refund-o-2
	xss        int64 // the dead-letter row of the message with markup for an id
	effect     string
	partitions string
}

func TestAnOperatorRedrivesAndResolvesThroughABrowser(t *testing.T) {
	exe := chromium(t)
	w := newWorld(t)
	c := w.serve(console.Config{BasicAuth: map[string]string{"alice": "correct horse battery"}, Health: w.health})
	ctx := browse(t, exe)
	var dialogs atomic.Int32
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
		}
	}))
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:correct horse battery"))
	_, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}})
	require.NoError(t, err)

	visit(t, ctx, c.base+"/", "overview")
	require.Contains(t, text(t, ctx, "main"), "billing")
	visit(t, ctx, c.base+"/deadletters", "deadletters")
	requireInert(t, ctx)

	visit(t, ctx, c.base+"/deadletters/"+strconv.FormatInt(w.xss, 10), "")
	requireInert(t, ctx)
	require.Contains(t, text(t, ctx, "main table"), xssID, "the id renders as text")

	// The bug is fixed: redrive the refund from its page.
	w.fixed.Store(true)
	visit(t, ctx, c.base+"/deadletters/"+strconv.FormatInt(w.refund, 10), "deadletter")
	submit(t, ctx, "/deadletters/redrive", "", "refunds ship in this release")
	require.Contains(t, text(t, ctx, "main"), "moved 1 of")
	shot(t, ctx, "redrive")
	require.Eventually(t, func() bool { return w.redrivenBy(w.refund) == "alice" }, 10*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return w.applied("billing", "refund-o-2") }, 30*time.Second, 100*time.Millisecond,
		"the redriven refund is applied by the consumer")

	// The gateway has no record of the charge: resolve the unknown effect.
	visit(t, ctx, c.base+"/ledger", "ledger")
	visit(t, ctx, c.base+"/ledger/effect?id="+w.effect, "effect")
	submit(t, ctx, "/ledger/resolve", "succeeded", "INC-42: the gateway shows the charge as captured")
	require.Contains(t, text(t, ctx, "main"), "now succeeded, audited as alice")
	require.Equal(t, "succeeded", w.status(w.effect))
	require.Equal(t, []string{"alice: unknown -> succeeded: INC-42: the gateway shows the charge as captured"}, w.audit(w.effect))

	visit(t, ctx, c.base+"/http", "http")
	visit(t, ctx, c.base+"/replays", "replays")
	require.Eventually(t, func() bool {
		visit(t, ctx, c.base+"/partitions", "")
		return strings.Contains(text(t, ctx, "main"), "Processes that joined: 2.") &&
			strings.Count(text(t, ctx, "main table"), "127.0.0.1") == 2
	}, 30*time.Second, 500*time.Millisecond, "two processes share the partitions")
	visit(t, ctx, c.base+"/partitions", "partitions")
	require.Contains(t, text(t, ctx, "main"), w.partitions)

	ro := w.serve(console.Config{ReadOnly: true, Operator: "viewer"})
	for _, path := range []string{"/", "/deadletters", "/deadletters/" + strconv.FormatInt(w.xss, 10), "/ledger", "/ledger/effect?id=" + w.effect,
		"/http", "/replays", "/partitions"} {
		visit(t, ctx, ro.base+path, "")
		forms, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('form[method=post]').length`))
		require.NoError(t, err)
		require.Zero(t, forms, "read-only %s has a form that acts", path)
	}
	require.Zero(t, dialogs.Load(), "a dialog opened: a value from a message ran as script")
}

// newWorld runs the workers and waits for the data they make.
func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{fixture: newFixture(t)}
	ctx, cancel := context.WithCancel(context.Background())
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	gateway := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.WriteHeader(http.StatusBadGateway) // the charge may have happened: unknown
	}))
	t.Cleanup(gateway.Close)
	led, err := ledger.New(ledger.Config{Pool: w.pool, Tables: w.tables})
	require.NoError(t, err)
	queue := testbroker.Queue(t)
	w.queue = queue // the console redrives through the broker
	billing, err := consumer.New(consumer.Config{AMQPURL: testbroker.URL(), Name: "billing", Pool: w.pool, Tables: w.tables,
		Queue: queue, StorePayloads: true, Logger: quiet})
	require.NoError(t, err)
	billing.Handle(consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, v struct{ Kind, Order string }) error {
		switch {
		case v.Kind == "charge":
			_, err := led.Record(ctx, tx, ledger.Effect{Type: "payment.capture", BusinessKey: v.Order, Target: gateway.URL,
				Request: v, Consumer: "billing", MessageID: m.ID})
			return err
		case v.Kind == "refund" && !w.fixed.Load():
			return consumer.DeadLetter("refund_not_supported", errors.New("refunds are not implemented yet"))
		}
		return nil
	}))
	dispatcher, err := ledger.NewDispatcher(ledger.DispatcherConfig{Pool: w.pool, Tables: w.tables, Logger: quiet,
		Executors: map[string]ledger.Executor{"payment.capture": &ledger.HTTPExecutor{}}})
	require.NoError(t, err)
	w.partitions = testbroker.Queue(t)
	testbroker.PartitionsAtEnd(t, w.partitions, 2)
	runs := []func(context.Context) error{billing.Run, dispatcher.Run}
	w.health = []health.Reporter{billing, dispatcher}
	for range 2 { // two processes of shipping share its two partitions
		shipping, err := consumer.New(consumer.Config{AMQPURL: testbroker.URL(), Name: "shipping", Pool: w.pool, Tables: w.tables,
			Queue: w.partitions, Partitions: 2, Logger: quiet})
		require.NoError(t, err)
		shipping.Handle(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
		runs, w.health = append(runs, shipping.Run), append(w.health, shipping)
	}
	done := make(chan struct{}, len(runs))
	for _, run := range runs {
		go func() { _ = run(ctx); done <- struct{}{} }() // stopped by cancel at cleanup
	}
	t.Cleanup(func() {
		cancel()
		for range runs {
			<-done
		}
	})
	w.publish(queue)
	w.rows()
	return w
}

// publish sends the messages once the consumers declared their queues.
func (w *world) publish(queue string) {
	w.t.Helper()
	ch := testbroker.Channel(w.t)
	require.NoError(w.t, ch.Confirm(false))
	require.Eventually(w.t, func() bool {
		probe := testbroker.Channel(w.t)
		_, err := probe.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err == nil {
			_, err = probe.QueueDeclarePassive(w.partitions+".p1", true, false, false, false, nil)
		}
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "the consumers declared their queues")
	send := func(dc *amqp.DeferredConfirmation, err error) {
		require.NoError(w.t, err)
		ok, err := dc.WaitContext(context.Background())
		require.NoError(w.t, err)
		require.True(w.t, ok)
	}
	for id, body := range map[string]string{"charge-o-1": `{"kind":"charge","order":"o-1"}`,
		"refund-o-2": `{"kind":"refund","order":"o-2"}`, xssID: `{"kind":"refund","order":"o-3"}`} {
		send(ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, true, false,
			amqp.Publishing{MessageId: id, Body: []byte(body), ContentType: "application/json"}))
	}
	for i := range 6 {
		send(partitions.Publish(context.Background(), ch, w.partitions, 2, "parcel-"+strconv.Itoa(i),
			amqp.Publishing{MessageId: "ship-" + strconv.Itoa(i), Body: []byte(`{}`)}))
	}
}

// rows waits for what the workers write, and adds an HTTP key of unknown
// outcome and an interrupted online rebuild (written as their packages
// write them), so that every screen has something to show.
func (w *world) rows() {
	w.t.Helper()
	ctx := context.Background()
	require.Eventually(w.t, func() bool {
		var n int
		err := w.pool.QueryRow(ctx, "SELECT count(*) FROM "+w.tables.Table("dead_letters")).Scan(&n)
		return err == nil && n == 2
	}, 60*time.Second, 100*time.Millisecond, "two refunds dead-lettered")
	require.NoError(w.t, w.pool.QueryRow(ctx, "SELECT id FROM "+w.tables.Table("dead_letters")+" WHERE message_id = 'refund-o-2'").Scan(&w.refund))
	require.NoError(w.t, w.pool.QueryRow(ctx, "SELECT id FROM "+w.tables.Table("dead_letters")+" WHERE message_id = $1", xssID).Scan(&w.xss))
	require.Eventually(w.t, func() bool {
		err := w.pool.QueryRow(ctx, "SELECT effect_id FROM "+w.tables.Table("ledger")+" WHERE status = 'unknown'").Scan(&w.effect)
		return err == nil
	}, 60*time.Second, 100*time.Millisecond, "the charge's outcome is unknown")
	require.Eventually(w.t, func() bool { return w.applied("shipping", "ship-5") }, 60*time.Second, 100*time.Millisecond)
	for _, sql := range []string{
		`INSERT INTO ` + w.tables.Table("http_keys") + ` (key_id, tenant, caller, operation, idempotency_key, fingerprint, state,
			attempts, completed_at, expires_at) VALUES (sha256('k1'), 'acme', 'checkout-web', 'create-payment', 'pay-7f3a',
			sha256('body'), 'unknown', 1, now(), now() + interval '1 day')`,
		`INSERT INTO ` + w.tables.Table("replay_runs") + ` (run_id, mode, consumer, stream, from_position, to_position, end_offset,
			live_offset, projection, projection_schema, projection_tables) VALUES ('rb-20240601', 'rebuild', 'billing', 'billing-events',
			'first', 'tail', 90000, 88000, 'balances', 'public', '{balances}')`,
		`INSERT INTO ` + w.tables.Table("checkpoints") + ` (consumer, stream, last_offset) VALUES ('billing@replay:rb-20240601',
			'billing-events', 41250), ('billing-projection', 'billing-events', 88000)`,
	} {
		_, err := w.pool.Exec(ctx, sql)
		require.NoError(w.t, err)
	}
}

// applied reports whether consumer's inbox holds id.
func (w *world) applied(consumer, id string) bool {
	var n int
	err := w.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+w.tables.Table("inbox")+
		" WHERE consumer = $1 AND message_id = $2", consumer, id).Scan(&n)
	return err == nil && n == 1
}

// browse starts headless Chromium with the flags that work in a container.
func browse(t *testing.T, exe string) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), chromedp.ExecPath(exe), chromedp.Headless,
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1360, 900))
	ctx, cancel := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 4*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancel(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1360, 900)))
	return ctx
}

// visit opens url, waits for its heading and, when name is set, saves a
// screenshot of it.
func visit(t *testing.T, ctx context.Context, url, name string) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS("main h1"))), url)
	if name != "" {
		shot(t, ctx, name)
	}
}

// shot saves the page as docs/console/NAME.png.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(screenshots, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(screenshots, name+".png"), png, 0o644))
}

// text is the visible text of the first element sel matches.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(t, err)
	return s
}

// submit fills the form that posts to action (its select "as" when as is
// set, its reason), submits it with its button, and waits for the page
// that answers.
func submit(t *testing.T, ctx context.Context, action, as, reason string) {
	t.Helper()
	sel := `form[action$="` + action + `"]`
	steps := []chromedp.Action[chromedp.Void]{chromedp.SendKeys(chromedp.CSS(sel+` input[name=reason]`), reason)}
	if as != "" {
		steps = append(steps, chromedp.SetValue(chromedp.CSS(sel+` select[name=as]`), as))
	}
	step, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, chromedp.Do(step, steps...), "fill the form %s", sel)
	require.NoError(t, chromedp.Do(step, chromedp.Click(chromedp.CSS(sel+` button`))), "submit %s", sel)
	require.Eventually(t, func() bool {
		loc, err := chromedp.Run(step, chromedp.Location())
		return err == nil && strings.HasSuffix(loc, action)
	}, time.Minute, 50*time.Millisecond, "the answer to %s", sel)
	require.NoError(t, chromedp.Do(step, chromedp.WaitVisible(chromedp.CSS("main h1"))))
}

// requireInert fails when the page holds an image or a script a message
// could have injected.
func requireInert(t *testing.T, ctx context.Context) {
	t.Helper()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('img, script, iframe, [onerror], [onload]').length`))
	require.NoError(t, err)
	require.Zero(t, n)
	body, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main")))
	require.NoError(t, err)
	require.True(t, strings.Contains(body, xssID), "the id shows as text: %s", body)
}
