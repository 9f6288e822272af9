package ledger

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/health"
)

// claimTimeout bounds one claim statement; the claim loop may not tick
// while it runs.
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
	tick      atomic.Int64           // unix nanoseconds of the last loop turn
	dbErr     atomic.Pointer[string] // the last claim or sweep error; nil after a success
}

func (v *vitals) ticked() { v.tick.Store(time.Now().UnixNano()) }

// observe records the outcome of a database call of the loops.
func (v *vitals) observe(err error) {
	if err == nil {
		v.dbErr.Store(nil)
		return
	}
	s := truncate(err.Error(), 200)
	v.dbErr.Store(&s)
}

// Health reports the dispatcher's health, for health.Handler:
//
//   - Ready while Run runs, its notification listener is connected and its
//     last claim or sweep statement succeeded;
//   - Live unless Run has returned or its loops have not turned for longer
//     than a claim may take (30s) plus three PollIntervals: a dispatcher
//     that waits for its database is live but not ready.
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
	if since := time.Since(time.Unix(0, d.vitals.tick.Load())); since > claimTimeout+3*d.cfg.PollInterval {
		s.Live, s.Ready = false, false
		reasons = append(reasons, fmt.Sprintf("its loop has not turned for %s", since.Round(time.Second)))
	}
	if e := d.vitals.dbErr.Load(); e != nil {
		s.Ready = false
		reasons = append(reasons, "database: "+*e)
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
