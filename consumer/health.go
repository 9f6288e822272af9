package consumer

import (
	"fmt"
	"strings"

	"github.com/idemkit/idem/health"
)

// Health reports the consumer's state for health probes (see package
// health): ready while Run is connected to the broker and consuming (a
// stream consumer: reading, or standing by while another process reads);
// live while its batches make progress — none has gone without a handler
// finishing or a commit for longer than a handler may run (HandlerTimeout,
// then the grace before it is abandoned) plus CommitTimeout. A consumer
// whose Run returned with an error is not live. Health reads what the
// runtime last observed; it never blocks.
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
	if d, stalled := v.Stalled(c.eng.StallLimit()); stalled {
		s.Live, s.Ready = false, false
		reasons = append(reasons, fmt.Sprintf("no batch progress for %s", d.Round(1e9)))
	}
	s.Reason = strings.Join(reasons, "; ")
	return s
}
