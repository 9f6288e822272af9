package ledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/internal/retry"
	"github.com/idemkit/idem/internal/safetext"
	"github.com/idemkit/idem/internal/tracing"
)

// DispatcherConfig configures a Dispatcher.
type DispatcherConfig struct {
	// BatchSize is the most effects claimed in one statement. Default: 100.
	BatchSize int
	// Concurrency is the most executor calls in flight at once. Default: 16.
	Concurrency int
	// Executors carry out effects, by effect type. A dispatcher claims only
	// the types it has an executor for. Required.
	Executors map[string]Executor
	// Lease is how long a claim holds an effect. Calls get a deadline just
	// before it ends; an effect whose lease ends while in flight becomes
	// unknown (or due again, when its executor deduplicates by key).
	// Default: 1 minute.
	Lease time.Duration
	// Logger receives the dispatcher's logs. Default: slog.Default().
	Logger *slog.Logger
	// MaxAttempts is how many attempts an effect gets. When they run out a
	// retryable effect becomes failed_terminal, or unknown if an attempt
	// may have taken effect (Entry.MaybeSent). Default: 20.
	MaxAttempts int
	// MeterProvider provides the meter for the dispatcher's metrics.
	// Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// PollInterval is how often the dispatcher looks for due effects without
	// being notified, sweeps expired leases and refreshes its gauges.
	// Default: 1 second.
	PollInterval time.Duration
	// Pool is the database. The dispatcher holds one extra connection,
	// taken out of the pool, for LISTEN. Required.
	Pool *pgxpool.Pool
	// ReconcileInterval is how long an unknown effect waits between lookups
	// when its executor is a Reconciler. Default: 1 minute.
	ReconcileInterval time.Duration
	// RetryBackoff is the delay before the second attempt; each further
	// attempt waits twice as long, with jitter, up to RetryBackoffMax.
	// Default: 1 second.
	RetryBackoff time.Duration
	// RetryBackoffMax caps the delay between attempts. Default: 10 minutes.
	RetryBackoffMax time.Duration
	// Tables says where the ledger's tables live. Default: idem's defaults.
	Tables idem.Tables
	// TracerProvider provides the tracer of the dispatch spans. Each
	// executor call and reconciler lookup runs in a span that is a child of
	// the span that recorded the effect (see Record), and the executors
	// start their client or producer spans, from the same provider, under
	// it. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

func (c *DispatcherConfig) setDefaults() {
	if c.BatchSize <= 0 {
		c.BatchSize = 100
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 16
	}
	if c.Lease <= 0 {
		c.Lease = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 20
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.ReconcileInterval <= 0 {
		c.ReconcileInterval = time.Minute
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = time.Second
	}
	if c.RetryBackoffMax <= 0 {
		c.RetryBackoffMax = 10 * time.Minute
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
}

// Dispatcher carries out recorded effects: it claims due effects in batches
// (FOR UPDATE SKIP LOCKED, a lease and an owner token per claim), calls their
// executors outside any transaction, and writes each outcome with an UPDATE
// guarded by status and owner token, so that a stale owner cannot overwrite a
// newer claim. Any number of dispatchers may run at once, in any processes.
type Dispatcher struct {
	cfg     DispatcherConfig
	sql     *statements
	metrics *metrics
	tracer  trace.Tracer
	log     *slog.Logger

	types     []string // effect types with an executor
	dedup     []string // ... whose executor deduplicates by key
	reconcile []string // ... whose executor is a Reconciler

	owner   string // process-unique prefix of owner tokens
	seq     atomic.Uint64
	running atomic.Bool
	vitals  vitals           // what Health reports
	db      *health.Database // probes the database while Run runs

	// dbTimeout bounds each database call of the loops: claimTimeout, but
	// tests of stalled connections shorten it.
	dbTimeout time.Duration
}

// NewDispatcher validates cfg and returns a Dispatcher; start it with Run.
func NewDispatcher(cfg DispatcherConfig) (*Dispatcher, error) {
	cfg.setDefaults()
	if cfg.Pool == nil {
		return nil, fmt.Errorf("ledger: %w: DispatcherConfig.Pool is required", idem.ErrConfig)
	}
	if len(cfg.Executors) == 0 {
		return nil, fmt.Errorf("ledger: %w: DispatcherConfig.Executors is empty", idem.ErrConfig)
	}
	s, err := newStatements(cfg.Tables)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("ledger: metrics: %w", err)
	}
	d := &Dispatcher{cfg: cfg, sql: s, metrics: m, log: cfg.Logger, dbTimeout: claimTimeout,
		tracer: cfg.TracerProvider.Tracer(instrumentation, trace.WithSchemaURL(tracing.SchemaURL)),
		db:     health.NewDatabase(cfg.Pool, "ledger dispatcher database")}
	for typ, ex := range cfg.Executors {
		if ex == nil {
			return nil, fmt.Errorf("ledger: %w: executor for %q is nil", idem.ErrConfig, typ)
		}
		d.types = append(d.types, typ)
		if ex.DeduplicatesByKey() {
			d.dedup = append(d.dedup, typ)
		}
		if _, ok := ex.(Reconciler); ok {
			d.reconcile = append(d.reconcile, typ)
		}
	}
	sort.Strings(d.types)
	var b [6]byte
	_, _ = rand.Read(b[:])
	host, _ := os.Hostname()
	d.owner = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	return d, nil
}

// run is the state of one Run call.
type run struct {
	ctx      context.Context // Run's context, cancelled at shutdown
	detached context.Context // for calls and outcome writes that must outlive shutdown
	wake     chan struct{}   // a notification arrived
	freed    chan struct{}   // a call finished
	outcomes chan outcome
	abandon  chan struct{} // closed when Run stops waiting for calls
	inflight atomic.Int64
	calls    sync.WaitGroup
	mu       sync.Mutex
	deadline time.Time // the latest call deadline handed out
}

// Run dispatches effects until ctx is cancelled. Then it stops claiming,
// waits for the calls in flight (at most until their leases end: a call still
// running then is abandoned to the lease sweep), writes their outcomes and
// returns nil. It returns an error only if it cannot start. A Dispatcher runs
// once at a time.
func (d *Dispatcher) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("ledger: dispatcher is already running")
	}
	defer d.running.Store(false)
	d.vitals.ticked()
	d.vitals.state.Store(stateRunning)
	defer d.vitals.state.Store(stateStopped)
	reg, err := d.metrics.observe()
	if err != nil {
		return fmt.Errorf("ledger: register gauges: %w", err)
	}
	defer func() { _ = reg.Unregister() }()
	ready, err := health.ObserveReady(d.cfg.MeterProvider, d)
	if err != nil {
		return fmt.Errorf("ledger: register the readiness gauge: %w", err)
	}
	defer func() { _ = ready.Unregister() }()

	r := &run{
		ctx:      ctx,
		detached: context.WithoutCancel(ctx),
		wake:     make(chan struct{}, 1),
		freed:    make(chan struct{}, 1),
		outcomes: make(chan outcome, 2*d.cfg.Concurrency),
		abandon:  make(chan struct{}),
	}
	var bg sync.WaitGroup
	bg.Go(func() { d.db.Run(ctx) })
	bg.Go(func() { d.listen(ctx, r.wake) })
	bg.Go(func() { d.sweepLoop(r) })
	completed := make(chan struct{})
	finish := make(chan struct{})
	go func() {
		defer close(completed)
		d.completeLoop(r, finish)
	}()

	d.claimLoop(r)

	// The sweep loop may still start lookups until it stops: wait for it
	// before waiting for the calls, so that no call starts after that.
	bg.Wait()
	d.waitCalls(r)
	close(finish)
	<-completed
	return nil
}

// claimLoop claims due effects whenever there is room for them, until the
// run's context is cancelled.
func (d *Dispatcher) claimLoop(r *run) {
	poll := time.NewTicker(d.cfg.PollInterval)
	defer poll.Stop()
	// Claim in chunks of at least this many free slots while busy, so that a
	// saturated dispatcher does not commit a claim per finished call.
	threshold := max(1, min(d.cfg.BatchSize, d.cfg.Concurrency)/2)
	for r.ctx.Err() == nil {
		d.vitals.claim.ticked()
		waitSlot := false
		if free := d.cfg.Concurrency - int(r.inflight.Load()); free > 0 {
			want := min(free, d.cfg.BatchSize)
			n, err := d.claim(r, want)
			if r.ctx.Err() == nil {
				d.vitals.claim.observe(err)
			}
			if err != nil && r.ctx.Err() == nil {
				d.log.Error("ledger: claim effects", "error", err)
			}
			if err == nil && n == want {
				if want < free {
					continue // limited by BatchSize: more may be due
				}
				waitSlot = true
			}
		} else {
			waitSlot = true
		}
		for {
			var freed chan struct{}
			if waitSlot {
				freed = r.freed
			}
			select {
			case <-r.ctx.Done():
				return
			case <-r.wake:
			case <-poll.C:
			case <-freed:
				if d.cfg.Concurrency-int(r.inflight.Load()) < threshold {
					continue
				}
			}
			break
		}
	}
}

// claim takes up to n due effects and starts a call for each.
func (d *Dispatcher) claim(r *run, n int) (int, error) {
	owner := fmt.Sprintf("%s/%d", d.owner, d.seq.Add(1))
	// The local deadline starts before the claim, so it ends before the
	// lease the database computes.
	deadline := time.Now().Add(d.cfg.Lease * 9 / 10)
	if r.ctx.Err() != nil {
		return 0, nil
	}
	// The claim commits on its own: were it cancelled between the commit and
	// reading the rows, the claimed effects would never be called and would
	// end unknown. So it runs detached from shutdown, bounded by a timeout.
	cctx, cancel := context.WithTimeout(r.detached, d.dbTimeout)
	defer cancel()
	entries, err := d.claimRows(cctx, d.sql.claim, d.types, n, owner)
	if err != nil || len(entries) == 0 {
		return 0, err
	}
	d.start(r, entries, deadline, false)
	return len(entries), nil
}

func (d *Dispatcher) claimRows(ctx context.Context, query string, types []string, n int, owner string) ([]Entry, error) {
	rows, err := d.cfg.Pool.Query(ctx, query, types, n, owner, d.cfg.Lease.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("ledger: claim: %w", err)
	}
	defer rows.Close()
	var entries []Entry
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return nil, fmt.Errorf("ledger: claim: %w", err)
		}
		entries = append(entries, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: claim: %w", err)
	}
	return entries, nil
}

// start runs one call per entry, each in its own goroutine, owned by r.calls.
func (d *Dispatcher) start(r *run, entries []Entry, deadline time.Time, lookup bool) {
	r.mu.Lock()
	if deadline.After(r.deadline) {
		r.deadline = deadline
	}
	r.mu.Unlock()
	for _, e := range entries {
		d.metrics.transition(r.ctx, e.Type, StatusInFlight, 1)
		r.inflight.Add(1)
		r.calls.Go(func() {
			o := d.call(r.detached, e, deadline, lookup)
			select {
			case <-r.abandon:
				// Run has returned; the lease sweep settles this effect.
			case r.outcomes <- o:
			}
			r.inflight.Add(-1)
			select {
			case r.freed <- struct{}{}:
			default:
			}
		})
	}
}

// waitCalls waits for the calls in flight, at most until the last lease
// handed out ends.
func (d *Dispatcher) waitCalls(r *run) {
	done := make(chan struct{})
	go func() {
		r.calls.Wait()
		close(done)
	}()
	if r.inflight.Load() == 0 {
		<-done
		return
	}
	r.mu.Lock()
	wait := time.Until(r.deadline) + d.cfg.Lease/10
	r.mu.Unlock()
	t := time.NewTimer(max(wait, 0))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		d.log.Warn("ledger: calls still running after their lease ended; abandoning them to the lease sweep",
			"in_flight", r.inflight.Load())
		close(r.abandon)
	}
}

// call runs the executor (or the reconciler's lookup) for e, in a span of
// its own, and turns what it reports into an outcome.
func (d *Dispatcher) call(ctx context.Context, e Entry, deadline time.Time, lookup bool) outcome {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	ctx, span := d.startSpan(ctx, e, lookup)
	ex := d.cfg.Executors[e.Type]
	c := Call{EffectID: e.ID, Type: e.Type, BusinessKey: e.BusinessKey, Target: e.Target,
		IdempotencyKey: e.IdempotencyKey, Request: e.Request, Attempt: e.AttemptCount, RecordedAt: e.CreatedAt}
	begin := time.Now()
	var (
		res Result
		err error
	)
	if lookup {
		res, err = ex.(Reconciler).Lookup(ctx, c)
	} else {
		d.metrics.attempts.Add(ctx, 1, metric.WithAttributes(typeAttr(e.Type)))
		res, err = ex.Execute(ctx, c)
	}
	o := d.settle(e, res, err, lookup, ex.DeduplicatesByKey())
	endSpan(span, o)
	d.metrics.duration.Record(ctx, time.Since(begin).Seconds(),
		metric.WithAttributes(typeAttr(e.Type), statusAttr(o.status)))
	return o
}

// settle decides the status an attempt leaves e in.
func (d *Dispatcher) settle(e Entry, res Result, err error, lookup, dedup bool) outcome {
	o := outcome{id: e.ID, owner: e.LockOwner, typ: e.Type, status: res.Status, attempt: e.AttemptCount,
		lookup: lookup, maybeSent: e.MaybeSent}
	if err != nil {
		o.lastError = truncate(err.Error(), 1024)
	}
	if res.Response != nil {
		h := idem.HashBytes(res.Response)
		o.responseHash = h[:]
		o.response = res.Response[:min(len(res.Response), MaxResponse)]
	}
	switch o.status {
	case StatusSucceeded, StatusFailedTerminal, StatusFailedRetryable, StatusUnknown:
	default:
		o.status = StatusUnknown
	}
	if lookup && err != nil {
		// A lookup that failed says nothing of the request, whatever
		// status came with the error: the effect stays unknown.
		o.status = StatusUnknown
	}
	switch {
	case o.status == StatusUnknown:
		o.maybeSent = true
	case o.status == StatusFailedRetryable && lookup:
		// The target says it never saw the request: nothing was done.
		o.maybeSent = false
	}
	if o.status == StatusUnknown && (dedup || res.InProgress) && e.AttemptCount < d.cfg.MaxAttempts {
		// The target deduplicates by key (or said it holds the request and
		// is still working on it): sending again with the same key is safe
		// and settles the question.
		o.status = StatusFailedRetryable
		why := "outcome unknown, retrying with the same key: "
		if res.InProgress {
			why = "the target is still processing the request, asking again with the same key: "
		}
		o.lastError = why + o.lastError
	}
	switch o.status {
	case StatusFailedRetryable:
		if lookup {
			// The target never saw the request: due now, same key.
			break
		}
		if e.AttemptCount >= d.cfg.MaxAttempts {
			o.status, o.lastError = d.exhausted(e.AttemptCount, o.maybeSent, o.lastError)
			break
		}
		o.delay = max(d.backoff(e.AttemptCount), res.RetryAfter)
	case StatusUnknown:
		if slices.Contains(d.reconcile, e.Type) {
			o.delay = d.cfg.ReconcileInterval
		}
	}
	return o
}

// exhausted is the status and error of an effect whose last attempt failed
// retryably with no attempts left: failed_terminal when no attempt may have
// taken effect, unknown when one may have (a later "not sent" cannot undo
// an earlier attempt).
func (d *Dispatcher) exhausted(attempts int, maybeSent bool, lastError string) (Status, string) {
	if maybeSent {
		return StatusUnknown, fmt.Sprintf("gave up after %d attempts, an earlier one of which may have taken effect: %s",
			attempts, lastError)
	}
	return StatusFailedTerminal, fmt.Sprintf("gave up after %d attempts: %s", attempts, lastError)
}

// backoff is the delay after the attempt-th failed attempt: exponential, with
// jitter in [d/2, d].
func (d *Dispatcher) backoff(attempt int) time.Duration {
	return retry.Backoff(attempt, d.cfg.RetryBackoff, d.cfg.RetryBackoffMax)
}

// truncate returns s as storable text of at most n bytes: valid UTF-8 (an
// executor's error may quote a target's bytes, and a cut may split a
// character) and no NUL, which PostgreSQL text cannot hold. One bad error
// must not fail the batch of outcomes it is written with.
func truncate(s string, n int) string { return safetext.Truncate(safetext.Clean(s), n) }
