package ledger

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/health"
)

// claimTimeout bounds each database call of the dispatcher's loops (a claim,
// a sweep, a lookup claim, a gauge read, the listener's set-up and pings): a
// loop does not tick while one runs.
const claimTimeout = 30 * time.Second

// Run's lifecycle, as Health reports it.
const (
	stateNew int32 = iota
	stateRunning
	stateStopped
)

// vitals is what the dispatcher's loops last observed, for Health.
type vitals struct {
	state     atomic.Int32
	listening atomic.Bool
	claim     loopVitals // the claim loop
	sweep     loopVitals // the sweep loop: sweep, lookups, gauges
}

// loopVitals is what one loop last observed.
type loopVitals struct {
	tick  atomic.Int64           // unix nanoseconds of the last turn
	dbErr atomic.Pointer[string] // the last error of its statements; nil after a success
}

// ticked marks every loop as turned, when Run starts.
func (v *vitals) ticked() {
	v.claim.ticked()
	v.sweep.ticked()
}

func (l *loopVitals) ticked() { l.tick.Store(time.Now().UnixNano()) }

// observe records the outcome of a database call of the loop.
func (l *loopVitals) observe(err error) {
	if err == nil {
		l.dbErr.Store(nil)
		return
	}
	s := truncate(err.Error(), 200)
	l.dbErr.Store(&s)
}

// Health reports the dispatcher's health, for health.Handler:
//
//   - Ready while Run runs, its notification listener is connected (and
//     answers a ping after each PollInterval without a notification), the
//     last statement of its claim loop and of its sweep loop succeeded, and
//     the database takes writes: a probe over a connection of its own
//     checks it every 2 seconds (see health.Database), so a database that
//     refuses, stops answering or turns read-only makes it not ready within
//     about 6 seconds, whatever the loops are waiting for;
//   - Live unless Run has returned or its claim loop or its sweep loop has
//     not turned for longer than a database call may take (30s) plus three
//     PollIntervals: a dispatcher that waits for its database is live but
//     not ready.
//
// Before Run starts it is live and not ready.
func (d *Dispatcher) Health() health.Status {
	s := health.Status{Component: "ledger dispatcher", Ready: true, Live: true}
	switch d.vitals.state.Load() {
	case stateNew:
		return health.Status{Component: s.Component, Live: true, Reason: "not started"}
	case stateStopped:
		return health.Status{Component: s.Component, Reason: "stopped"}
	}
	var reasons []string
	loops := []struct {
		name string
		v    *loopVitals
	}{{"claim", &d.vitals.claim}, {"sweep", &d.vitals.sweep}}
	for _, l := range loops {
		if since := time.Since(time.Unix(0, l.v.tick.Load())); since > d.dbTimeout+3*d.cfg.PollInterval {
			s.Live, s.Ready = false, false
			reasons = append(reasons, fmt.Sprintf("its %s loop has not turned for %s", l.name, since.Round(time.Millisecond)))
		}
	}
	for _, l := range loops {
		if e := l.v.dbErr.Load(); e != nil {
			s.Ready = false
			reasons = append(reasons, "database: "+*e)
		}
	}
	if ok, why := d.db.Check(); !ok {
		s.Ready = false
		reasons = append(reasons, why)
	}
	if !d.vitals.listening.Load() {
		s.Ready = false
		reasons = append(reasons, "not listening for notifications")
	}
	for i, r := range reasons {
		if i > 0 {
			s.Reason += "; "
		}
		s.Reason += r
	}
	return s
}
