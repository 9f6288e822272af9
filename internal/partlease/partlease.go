// Package partlease spreads the partitions of one consumer over the
// processes that run it, with PostgreSQL advisory locks on one session per
// process: no coordinator of its own, no table.
//
// Each process joins by taking a shared advisory lock on the consumer's
// member key: the number of sessions holding it is the number of live
// members. A process holds partition i while its session holds the
// exclusive advisory lock of i. Every Interval it counts the members and
// keeps its share: at most ceil(N/members) partitions. Above it, it lets
// partitions go (stopping their consumption first, then unlocking); below
// it, it takes free ones. A process that dies, or whose session dies (the
// server ends one whose host is lost or whose process is frozen: see
// sessionKeepalive and endWhenIdle), drops all its locks at once, and the
// others take its partitions at their next turn; a process that joins makes the others let partitions go, which it
// then takes. So with 3 processes and 8 partitions each holds 2 or 3.
//
// The locks decide who consumes; they do not make two consumers of one
// partition impossible on their own (a session may die while its process
// still consumes, until the process notices): the broker's single active
// consumer on each partition queue is the fence, and the inbox dedups what
// a handover redelivers.
package partlease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/retry"
)

// Config configures Run.
type Config struct {
	// Key names the consumer whose partitions are spread: processes with
	// one Key share the partitions. Required.
	Key string
	// Partitions is the number of partitions, N. Required.
	Partitions int
	// Conn says how to connect the session that holds the locks: a
	// connection of its own, outside the application's pool. Required.
	Conn *pgx.ConnConfig
	// Interval is how often the members are counted and the share kept.
	// Default: 1s.
	Interval time.Duration
	// Timeout bounds each statement, and the connect. Default: 5s.
	Timeout time.Duration
	// Logger receives the assignment's logs. Default: slog.Default().
	Logger *slog.Logger
	// MeterProvider provides the gauge idem.consumer.partitions.unheld,
	// with Attributes (the consumer's). Default: the global provider.
	MeterProvider metric.MeterProvider
	Attributes    []attribute.KeyValue
}

func (c Config) withDefaults() Config {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Status is what a process holds, for health reports and tests.
type Status struct {
	// Joined reports that the session is up and the process a member.
	Joined bool
	// Members is the number of members at the last count.
	Members int
	// Held are the partitions this process holds, ascending.
	Held []int
	// Unheld is how many partitions no member held after this process's
	// last turn: a process that died, or one that lets partitions go
	// while no one takes them, leaves some until a member's next turn.
	Unheld int
	// Trouble says why the process is not a member, when it knows.
	Trouble string
}

// Lease is one process's part in the assignment. Run it with Run.
type Lease struct {
	cfg    Config
	member int64   // the shared lock every member holds
	keys   []int64 // partition i's exclusive lock
	log    *slog.Logger

	mu     sync.Mutex
	status Status
	pid    atomic.Uint32 // the session's backend, 0 between sessions (tests)
}

// New returns the lease of this process for cfg.
func New(cfg Config) (*Lease, error) {
	cfg = cfg.withDefaults()
	switch {
	case cfg.Key == "":
		return nil, errors.New("partlease: Key is required")
	case cfg.Partitions < 1:
		return nil, errors.New("partlease: Partitions must be at least 1")
	case cfg.Conn == nil:
		return nil, errors.New("partlease: Conn is required")
	}
	member, keys := LockKeys(cfg.Key, cfg.Partitions)
	return &Lease{cfg: cfg, member: member, keys: keys, log: cfg.Logger.With(slog.String("partitions_of", cfg.Key))}, nil
}

// LockKeys are the advisory lock keys of the lease Key key with n
// partitions: the member key every member holds shared, and partition i's
// key at index i, held exclusively by its holder. pg_locks shows them (the
// operator console reads who holds what there).
func LockKeys(key string, n int) (member int64, partitions []int64) {
	partitions = make([]int64, n)
	for i := range n {
		partitions[i] = pglock.Key(fmt.Sprintf("partlease/%s/%d", key, i))
	}
	return pglock.Key("partlease/" + key + "/members"), partitions
}

// Status returns what the process holds now.
func (l *Lease) Status() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.status
	s.Held = slices.Clone(s.Held)
	return s
}

// Run takes part in the assignment until ctx ends. For each partition i it
// takes, it calls consume(ctx, i) in a goroutine of its own; to let i go it
// cancels that ctx and waits for consume to return before it unlocks i, so
// that the next holder starts after this one stopped. consume must return
// soon after its ctx ends; a consume that returns an error while its
// partition is held ends Run with that error, after every other consume
// returned. When the session fails, every consume is stopped and Run joins
// again after a backoff. On cancellation Run stops every consume, closes
// the session and returns nil.
func (l *Lease) Run(ctx context.Context, consume func(ctx context.Context, i int) error) error {
	reg, err := l.observe()
	if err != nil {
		return fmt.Errorf("partlease: register the gauge: %w", err)
	}
	defer func() { _ = reg.Unregister() }()
	for failures := 0; ; {
		err := l.session(ctx, consume)
		l.setStatus(func(s *Status) { s.Joined, s.Held = false, nil })
		var fatal *consumeError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &fatal):
			return fatal.err
		}
		failures++
		delay := retry.Backoff(failures, 100*time.Millisecond, 10*time.Second)
		l.log.Warn("partlease: session ended; joining again", "error", err, "retry_in", delay)
		l.setStatus(func(s *Status) { s.Trouble = "partition lease: " + err.Error() })
		if !retry.Sleep(ctx, delay) {
			return nil
		}
	}
}

// consumeError is a consume that failed while its partition was held.
type consumeError struct{ err error }

func (e *consumeError) Error() string { return e.err.Error() }

// held is one partition this session holds and consumes.
type held struct {
	stop context.CancelFunc
	done chan error // consume's result
}

// session joins once and keeps the share until ctx ends or the session
// fails.
func (l *Lease) session(ctx context.Context, consume func(ctx context.Context, i int) error) (err error) {
	conn, err := l.connect(ctx)
	if err != nil {
		return err
	}
	l.pid.Store(conn.PgConn().PID())
	owned := map[int]*held{}
	defer func() {
		for i := range owned {
			l.let(owned, i)
		}
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(closeCtx) // drops every lock of the session
		cancel()
		l.pid.Store(0)
	}()
	if err := l.exec(ctx, conn, `SELECT pg_advisory_lock_shared($1)`, l.member); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	l.setStatus(func(s *Status) { s.Joined, s.Trouble = true, "" })
	l.log.Info("partlease: joined")
	// Processes started together see each other at the first count.
	t := time.NewTimer(l.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for i, h := range owned {
			select {
			case err := <-h.done:
				delete(owned, i)
				h.stop()
				if err != nil {
					return &consumeError{fmt.Errorf("partition %d: %w", i, err)}
				}
			default:
			}
		}
		if err := l.balance(ctx, conn, owned, consume); err != nil {
			return err
		}
		t.Reset(l.cfg.Interval)
	}
}

// balance counts the members and keeps this process's share: at most
// ceil(N/members) partitions, taking free ones while below it.
func (l *Lease) balance(ctx context.Context, conn *pgx.Conn, owned map[int]*held, consume func(ctx context.Context, i int) error) error {
	members, holding, err := l.count(ctx, conn)
	if err != nil {
		return fmt.Errorf("count members: %w", err)
	}
	share := (l.cfg.Partitions + members - 1) / members
	for len(owned) > share {
		i := slices.Max(keysOf(owned))
		l.let(owned, i)
		if err := l.exec(ctx, conn, `SELECT pg_advisory_unlock($1)`, l.keys[i]); err != nil {
			return fmt.Errorf("let partition %d go: %w", i, err)
		}
		holding--
		l.log.Info("partlease: let a partition go", "partition", i, "members", members, "share", share)
	}
	// Free partitions are tried from a random start, so that processes
	// joining together rarely race for the same one.
	start := rand.IntN(l.cfg.Partitions)
	for k := 0; k < l.cfg.Partitions && len(owned) < share; k++ {
		i := (start + k) % l.cfg.Partitions
		if owned[i] != nil {
			continue
		}
		var got bool
		if err := l.query(ctx, conn, `SELECT pg_try_advisory_lock($1)`, []any{l.keys[i]}, &got); err != nil {
			return fmt.Errorf("take partition %d: %w", i, err)
		}
		if !got {
			continue
		}
		holding++
		pctx, stop := context.WithCancel(ctx)
		h := &held{stop: stop, done: make(chan error, 1)}
		owned[i] = h
		go func() { h.done <- consume(pctx, i) }() // owned by session: let stops it
		l.log.Info("partlease: took a partition", "partition", i, "members", members, "share", share)
	}
	l.setStatus(func(s *Status) {
		s.Members = members
		s.Held = slices.Sorted(slices.Values(keysOf(owned)))
		s.Unheld = max(l.cfg.Partitions-holding, 0)
	})
	return nil
}

// let stops consuming partition i and waits until its consume returned.
func (l *Lease) let(owned map[int]*held, i int) {
	h := owned[i]
	delete(owned, i)
	h.stop()
	if err := <-h.done; err != nil {
		l.log.Warn("partlease: partition stopped with an error", "partition", i, "error", err)
	}
}

// countSQL counts, in this database, the sessions holding the member lock
// ($1, $2) and the partition locks ($3, $4: their keys' halves) held.
const countSQL = `SELECT count(*) FILTER (WHERE classid::bigint = $1 AND objid::bigint = $2),
	count(*) FILTER (WHERE mode = 'ExclusiveLock' AND EXISTS (
		SELECT FROM unnest($3::bigint[], $4::bigint[]) AS k(hi, lo) WHERE k.hi = classid::bigint AND k.lo = objid::bigint))
FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// count counts the members, and the partitions any member holds.
func (l *Lease) count(ctx context.Context, conn *pgx.Conn) (members, holding int, err error) {
	hi, lo := split(l.member)
	his, los := make([]int64, len(l.keys)), make([]int64, len(l.keys))
	for i, k := range l.keys {
		his[i], los[i] = split(k)
	}
	err = l.query(ctx, conn, countSQL, []any{hi, lo, his, los}, &members, &holding)
	if err == nil && members < 1 {
		return 0, 0, errors.New("this session is not a member")
	}
	return members, holding, err
}

// observe registers the gauge of the partitions no member holds, read
// from Status while the process is a member.
func (l *Lease) observe() (metric.Registration, error) {
	mp := l.cfg.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter("github.com/idemkit/idem/consumer")
	g, err := m.Int64ObservableGauge("idem.consumer.partitions.unheld", metric.WithUnit("{partition}"),
		metric.WithDescription("Partitions of a partitioned queue that no member process held at this process's last turn."))
	if err != nil {
		return nil, err
	}
	attrs := metric.WithAttributeSet(attribute.NewSet(l.cfg.Attributes...))
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if s := l.Status(); s.Joined {
			o.ObserveInt64(g, int64(s.Unheld), attrs)
		}
		return nil
	}, g)
}

// split is how pg_locks shows a bigint advisory key: its high and low 32
// bits, as unsigned numbers.
func split(key int64) (hi, lo int64) {
	u := uint64(key)
	return int64(u >> 32), int64(u & 0xffffffff)
}

func keysOf(owned map[int]*held) []int {
	out := make([]int, 0, len(owned))
	for i := range owned {
		out = append(out, i)
	}
	return out
}

// sessionKeepalive are the server's TCP keepalive settings for the lease
// session, where Conn does not set them: the server probes a session idle
// for 3 s every second and drops it after 3 unanswered probes, so a process
// whose host is lost (no FIN, no RST) loses its locks within about 6 s of
// its last statement, and the others take its partitions at their next
// turn. Its statements, every Interval, keep a live session from idling.
// They apply to TCP connections; a Unix socket's peer cannot be lost so.
var sessionKeepalive = map[string]string{
	"tcp_keepalives_idle": "3", "tcp_keepalives_interval": "1", "tcp_keepalives_count": "3",
}

// connect opens the session within Timeout.
func (l *Lease) connect(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	cfg := l.cfg.Conn.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	for k, v := range sessionKeepalive {
		if _, set := cfg.RuntimeParams[k]; !set {
			cfg.RuntimeParams[k] = v
		}
	}
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if err := l.endWhenIdle(cctx, conn); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// endWhenIdle has the server end the session once it has been idle for
// idleLimit intervals (idle_session_timeout, PostgreSQL 14 and later; an
// older server has no such setting, and keeps a frozen process's session).
// A live session runs a statement every Interval; one whose process is
// frozen (SIGSTOP, a VM paused) sends nothing, and its locks would hold its
// partitions for as long as it stays frozen, since the kernel still answers
// the keepalive probes.
func (l *Lease) endWhenIdle(ctx context.Context, conn *pgx.Conn) error {
	limit := max(idleLimit*l.cfg.Interval, l.cfg.Timeout+l.cfg.Interval)
	_, err := conn.Exec(ctx, `SELECT set_config('idle_session_timeout', $1, false)`, fmt.Sprint(limit.Milliseconds()))
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42704" { // undefined_object: before PostgreSQL 14
		return nil
	}
	if err != nil {
		return fmt.Errorf("set idle_session_timeout: %w", err)
	}
	return nil
}

// idleLimit is how many Intervals a lease session may stay idle before the
// server ends it.
const idleLimit = 10

func (l *Lease) exec(ctx context.Context, conn *pgx.Conn, sql string, args ...any) error {
	qctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	_, err := conn.Exec(qctx, sql, args...)
	return err
}

func (l *Lease) query(ctx context.Context, conn *pgx.Conn, sql string, args []any, dest ...any) error {
	qctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	return conn.QueryRow(qctx, sql, args...).Scan(dest...)
}

func (l *Lease) setStatus(edit func(*Status)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	edit(&l.status)
}
