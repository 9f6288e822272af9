package amqpnames

import (
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// When the broker dead-letters a message (a rejection, a TTL, a length
// limit, a quorum queue's delivery limit) it records why in the message's
// x-death header: an array of tables, one per queue and reason, the newest
// first. A publisher can set the header too, to anything: what is read
// here is what the message claims, and its callers decide what it may
// steer (see deadletters' match.go and the consumer's cameBackFrom).

// deathHeader is the broker's dead-lettering record.
const deathHeader = "x-death"

// Death is one entry of a message's x-death header: the broker
// dead-lettered it from Queue for Reason. A field of the wrong type reads
// as its zero value.
type Death struct {
	// Queue is the queue it was dead-lettered from.
	Queue string
	// Reason is why: rejected, expired, maxlen, delivery_limit.
	Reason string
	// Time is the entry's time; zero when it has none.
	Time time.Time
}

// Deaths returns the entries of h's x-death header that are tables, the
// newest first; nil when h has none.
func Deaths(h amqp.Table) []Death {
	var out []Death
	for _, e := range entries(h) {
		if t, ok := e.(amqp.Table); ok {
			out = append(out, death(t))
		}
	}
	return out
}

// NewestDeath returns the newest entry of h's x-death header (the broker
// keeps the newest first). It reports false when the header is absent or
// empty, or its newest entry is not a table.
func NewestDeath(h amqp.Table) (Death, bool) {
	es := entries(h)
	if len(es) == 0 {
		return Death{}, false
	}
	t, ok := es[0].(amqp.Table)
	if !ok {
		return Death{}, false
	}
	return death(t), true
}

// IsDeathHeader reports whether name, in any case, is one of the headers
// the broker writes when it dead-letters a message: x-death,
// x-first-death-* and x-last-death-*.
func IsDeathHeader(name string) bool {
	n := strings.ToLower(name)
	return n == deathHeader || strings.HasPrefix(n, "x-first-death-") || strings.HasPrefix(n, "x-last-death-")
}

// entries are the elements of h's x-death header; nil when it is absent
// or not an array.
func entries(h amqp.Table) []any {
	es, _ := h[deathHeader].([]any)
	return es
}

// death reads one x-death entry.
func death(t amqp.Table) Death {
	var d Death
	d.Queue, _ = t["queue"].(string)
	d.Reason, _ = t["reason"].(string)
	d.Time, _ = t["time"].(time.Time)
	return d
}
