package consumer

import (
	"fmt"
	"strings"

	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/internal/engine"
)

// Health reports the consumer's state for health probes (see package
// health).
//
// Ready while Run is connected to the broker and consuming (a stream
// consumer: reading, or standing by while another process reads), the
// database takes writes (a probe over a connection of its own checks it
// every 2 seconds, see health.Database: a refusal, 2 seconds of silence or
// a read-only session make it not ready within about 6 seconds), the
// database answers the batches' own statements (one left unanswered for 3
// seconds beyond its lock wait makes the consumer not ready at once, even
// while the probe reaches another host: a pool whose connections went to a
// primary that froze before its standby was promoted), and the batch
// transactions have not kept failing for longer than 10 seconds.
//
// Live while its batches make progress: none has gone without a handler
// finishing or a commit for longer than a handler may run (HandlerTimeout,
// then the grace before it is abandoned) plus CommitTimeout. A transaction
// that fails and is retried is not progress; but while the database probe
// fails, a consumer without progress is waiting for its database, not
// wedged: it stays live (a restart would not bring the database back) and
// is not ready. A consumer whose Run returned with an error is not live.
// Health reads what the runtime last observed; it never blocks.
func (c *Consumer) Health() health.Status {
	v := &c.eng.Vitals
	s := health.Status{Component: "consumer " + c.cfg.Name, Live: true}
	var reasons []string
	switch {
	case v.Stopped.Load() != nil && !v.Running.Load():
		s.Live = false
		reasons = append(reasons, "stopped: "+*v.Stopped.Load())
	case !v.Running.Load():
		reasons = append(reasons, "not running")
	case v.Connected.Load():
		s.Ready = true
	case v.Trouble.Load() != nil && *v.Trouble.Load() != "":
		reasons = append(reasons, *v.Trouble.Load())
	default:
		reasons = append(reasons, "connecting")
	}
	dbOK, dbWhy := c.eng.DB.Check()
	if s.Ready && !dbOK {
		s.Ready = false
		reasons = append(reasons, dbWhy)
	}
	if d, late := v.Unanswered(engine.AnswerLimit); late {
		s.Ready = false
		reasons = append(reasons, fmt.Sprintf("database: a batch statement unanswered for %s", d.Round(1e8)))
	}
	if d, why, failing := v.Failing(engine.FailingLimit); failing {
		s.Ready = false
		reasons = append(reasons, fmt.Sprintf("batches failing for %s: %s", d.Round(1e9), why))
	}
	if d, stalled := v.Stalled(c.eng.StallLimit()); stalled {
		s.Ready = false
		if dbOK || !v.Running.Load() {
			s.Live = false // the database answers, yet nothing moves: wedged
		}
		reasons = append(reasons, fmt.Sprintf("no batch progress for %s", d.Round(1e9)))
	}
	s.Reason = strings.Join(reasons, "; ")
	return s
}

// readiness is the consumer as its readiness gauge sees it
// (health.ObserveReady, registered by New): its Health while a Run (or a
// stream's) runs or after one failed, nothing before it first runs or
// after it stopped.
func (c *Consumer) readiness() health.Status {
	v := &c.eng.Vitals
	if !v.Running.Load() && v.Stopped.Load() == nil {
		return health.Status{}
	}
	return c.Health()
}
