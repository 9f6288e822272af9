package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/pgnodes"
)

// Defaults of a Database probe.
const (
	// DefaultProbeInterval is how often a Database probe checks the
	// database.
	DefaultProbeInterval = 2 * time.Second
	// DefaultProbeTimeout bounds one check: the connection, when one is
	// needed, and the statement.
	DefaultProbeTimeout = 2 * time.Second
)

// Database is a Reporter that tells whether a PostgreSQL database can take
// writes now. Run checks it every interval over connections of its own,
// outside the application's pool, so that a pool busy with long batches is
// never taken for a dead database, and a database that stopped answering
// (a blackholed link) is noticed within the check's timeout instead of
// waiting for TCP. Every host of a multi-host URL is checked at once, each
// over its own connection: a dead host, first in the list or not, never
// spends the check's time that the others need. It is ready while its last
// check, at most two intervals and a timeout ago, reached a read-write
// session on some host; refused connections, checks past their timeout,
// or read-only sessions (a standby after a failover,
// default_transaction_read_only) on every host make it not ready. It is
// live whenever Run runs: a database outage is not a reason to restart a
// worker.
//
// The consumer and the ledger dispatcher run one each; run one beside an
// HTTP edge (inbox/httpinbox) and serve it with Handler:
//
//	db := health.NewDatabase(pool, "api database")
//	go db.Run(ctx)
//	go health.ListenAndServe(ctx, "0.0.0.0:8081", db)
type Database struct {
	component string
	hosts     []*hostProbe // one per host of the config, checked at once
	interval  time.Duration
	timeout   time.Duration

	mu       sync.Mutex
	running  bool
	okAt     time.Time // the last check that succeeded on a writable session
	checked  bool      // a check has ended
	lastFail string    // why the last check failed; "" when it succeeded
}

// hostProbe checks one host of the database.
type hostProbe struct {
	name   string // host:port, for reasons
	config *pgx.ConnConfig
	conn   *pgx.Conn // owned by Run
}

// NewDatabase returns a probe of the database pool connects to, reported as
// component, checking every DefaultProbeInterval within
// DefaultProbeTimeout. It does not connect: Run does.
func NewDatabase(pool *pgxpool.Pool, component string) *Database {
	return NewDatabaseProbe(pool.Config().ConnConfig.Copy(), component, DefaultProbeInterval, DefaultProbeTimeout)
}

// NewDatabaseProbe returns a probe of the database config names (each of
// its hosts), checking every interval within timeout (zero values take the
// defaults).
func NewDatabaseProbe(config *pgx.ConnConfig, component string, interval, timeout time.Duration) *Database {
	if interval <= 0 {
		interval = DefaultProbeInterval
	}
	if timeout <= 0 {
		timeout = DefaultProbeTimeout
	}
	d := &Database{component: component, interval: interval, timeout: timeout}
	for _, c := range pgnodes.Hosts(config) {
		d.hosts = append(d.hosts, &hostProbe{name: net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port))), config: c})
	}
	return d
}

// Run checks the database at once and then every interval until ctx ends,
// then closes its connections and returns. Call it once.
func (d *Database) Run(ctx context.Context) {
	d.mu.Lock()
	d.running = true
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.running = false
		d.mu.Unlock()
		for _, h := range d.hosts {
			h.disconnect(d.timeout)
		}
	}()
	t := time.NewTicker(d.interval)
	defer t.Stop()
	for {
		d.check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// errReadOnly is a check that reached a session that cannot write.
var errReadOnly = errors.New("the session is read-only (a standby, or default_transaction_read_only)")

// check checks every host at once, within the timeout, and records the
// result: a success when one host took it.
func (d *Database) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	errs := make([]error, len(d.hosts))
	var wg sync.WaitGroup
	for i, h := range d.hosts {
		wg.Go(func() { errs[i] = h.check(ctx, d.timeout) }) // each bounded by ctx
	}
	wg.Wait()
	var reasons []string
	for i, err := range errs {
		if err == nil {
			reasons = nil
			break
		}
		if len(d.hosts) == 1 {
			reasons = append(reasons, err.Error())
		} else {
			reasons = append(reasons, d.hosts[i].name+": "+err.Error())
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.checked = true
	if reasons != nil {
		d.lastFail = strings.Join(reasons, "; ")
		return
	}
	d.okAt, d.lastFail = time.Now(), ""
}

// check runs one check of the host within ctx, whose deadline is timeout
// away.
func (h *hostProbe) check(ctx context.Context, timeout time.Duration) error {
	err := h.query(ctx)
	if err == nil {
		return nil
	}
	h.disconnect(timeout) // a failed check may leave the connection in any state
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("no answer within %s", timeout)
	}
	return err
}

// query connects if needed and asks whether the session can write.
func (h *hostProbe) query(ctx context.Context) error {
	if h.conn == nil {
		conn, err := pgx.ConnectConfig(ctx, h.config)
		if err != nil {
			return err
		}
		h.conn = conn
	}
	var readOnly bool
	if err := h.conn.QueryRow(ctx, `SELECT current_setting('transaction_read_only') = 'on'`).Scan(&readOnly); err != nil {
		return err
	}
	if readOnly {
		return errReadOnly
	}
	return nil
}

// disconnect closes the connection, if any, within timeout.
func (h *hostProbe) disconnect(timeout time.Duration) {
	if h.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_ = h.conn.Close(ctx)
	h.conn = nil
}

// Check reports whether the database took the last check, recently enough,
// and if not, why: what a component that embeds the probe in its own
// report needs.
func (d *Database) Check() (ok bool, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	stale := 2*d.interval + d.timeout
	switch {
	case !d.running:
		return false, "database: not probed (not running)"
	case d.lastFail != "":
		return false, "database: " + d.lastFail
	case !d.checked:
		return false, "database: not probed yet"
	case time.Since(d.okAt) > stale:
		return false, fmt.Sprintf("database: no successful check for %s", time.Since(d.okAt).Round(time.Second))
	}
	return true, ""
}

// Health reports the probe as component: ready when Check says so, live
// while Run runs.
func (d *Database) Health() Status {
	ok, reason := d.Check()
	d.mu.Lock()
	live := d.running
	d.mu.Unlock()
	return Status{Component: d.component, Ready: ok, Live: live, Reason: reason}
}
