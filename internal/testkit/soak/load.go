package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/idemkit/idem/internal/testkit/soak/soakworker"
)

// hotAccounts is how many accounts the liveness workload deposits to: few
// enough that parallel batches and competing processes meet on them.
const hotAccounts = 20

// example is one of the workloads the soak drives: an example's worker, or
// the soak's own liveness worker.
type example int

const (
	quickstart example = iota
	payments
	orders
	// liveness is the soak's own worker (package soakworker): deposits on hot
	// accounts without an ordering key, and the target of the hang, crash
	// and compete faults.
	liveness
)

var exampleNames = [...]string{quickstart: "quickstart", payments: "payments", orders: "orders", liveness: "liveness"}

func (e example) String() string { return exampleNames[e] }

// pkg is the package of the example's binary.
func (e example) pkg() string {
	if e == liveness {
		return "./internal/testkit/soak"
	}
	return "./examples/" + e.String()
}

// bin is the name of the example's binary.
func (e example) bin() string {
	if e == liveness {
		return "soak"
	}
	return e.String()
}

func exampleByName(name string) (example, bool) {
	for i, n := range exampleNames {
		if n == name {
			return example(i), true
		}
	}
	return 0, false
}

// kind says what a published message is and what must become of it.
type kind int

const (
	// kindValid is the first copy of a valid message: its effect must be
	// applied exactly once.
	kindValid kind = iota
	// kindDup is the same message id and body again: a duplicate.
	kindDup
	// kindRetry (payments) is the same capture request under a new message
	// id, as a producer that retried sends it: a business duplicate.
	kindRetry
	// kindConflict is the message id of a valid message with another
	// payload: one of the two is dead-lettered with payload_conflict.
	kindConflict
	// kindCaptureConflict (payments) is the captureRequestId of a valid
	// message under a new id with another amount: one of the two is
	// dead-lettered with capture_request_conflict.
	kindCaptureConflict
	// kindMalformed can never be processed: dead-lettered with reason.
	kindMalformed
)

// message is one message of the load.
type message struct {
	ex     example
	kind   kind
	id     string // message id; empty for a message without one
	corr   string // correlation id (payments)
	body   []byte
	hash   [32]byte // SHA-256 of body: the consumers' payload hash
	reason string   // kindMalformed: the expected dead-letter reason
	of     int      // copies and conflicts: the index of the original in the plan
	// probe marks a valid message without copies or conflicts: a message
	// whose processing shows that its worker recovered from a fault.
	probe bool
	// key is the business key: the account (quickstart), the
	// captureRequestId (payments) or the order id (orders).
	key string
}

// plan is the whole load, in publishing order.
type plan struct {
	run  string // prefix of every id
	msgs []message
}

// newPlan generates the load of cfg for run: cfg.n valid messages split
// between the examples, with their copies, conflicts and malformed messages,
// each example's copies coming up to 50 of its messages later, and the
// examples interleaved at random.
func newPlan(cfg config, run string) plan {
	r := rand.New(rand.NewPCG(cfg.seed, 0x736f616b))
	per := cfg.n / len(cfg.examples)
	lists := make([][]message, len(cfg.examples))
	for i, ex := range cfg.examples {
		g := generator{r: r, cfg: cfg, run: run, ex: ex}
		lists[i] = g.generate(per)
	}
	p := plan{run: run}
	remaining := 0
	for _, l := range lists {
		remaining += len(l)
	}
	next := make([]int, len(lists))
	index := make([][]int, len(lists)) // list position → plan position
	for i, l := range lists {
		index[i] = make([]int, len(l))
	}
	for remaining > 0 {
		pick := r.IntN(remaining)
		for i, l := range lists {
			left := len(l) - next[i]
			if pick >= left {
				pick -= left
				continue
			}
			m := l[next[i]]
			if m.kind != kindValid && m.kind != kindMalformed {
				m.of = index[i][m.of]
			}
			index[i][next[i]] = len(p.msgs)
			p.msgs = append(p.msgs, m)
			next[i]++
			break
		}
		remaining--
	}
	return p
}

// generator makes one example's messages.
type generator struct {
	r   *rand.Rand
	cfg config
	run string
	ex  example
	out []message
	// later holds copies waiting for their position.
	later []delayed
	// orders in progress (orders example).
	active [][]orderEvent
	order  int
}

type delayed struct {
	at int
	m  message
}

type orderEvent struct {
	OrderID string `json:"orderId"`
	Version int    `json:"version"`
	Type    string `json:"type"`
}

func (g *generator) generate(n int) []message {
	if g.cfg.has(faultRetention) && (g.ex == quickstart || g.ex == payments) {
		// The retention fault's redrive door needs a dead letter older than
		// any horizon it will record: the load of these queues opens with one.
		g.emit(g.malformedMessage(n))
	}
	for i := range n {
		orig := len(g.out)
		m := g.valid(i)
		m.probe = true
		g.emit(m)
		roll := g.r.Float64()
		switch {
		case roll < g.cfg.conflict:
			g.out[orig].probe = false
			c := g.conflicting(g.out[orig])
			c.of = orig
			g.delay(c)
		case roll < g.cfg.conflict+g.cfg.dup:
			g.out[orig].probe = false
			c := g.out[orig]
			c.kind, c.of, c.probe = kindDup, orig, false
			if g.ex == payments && g.r.IntN(2) == 0 {
				c.kind, c.id = kindRetry, c.id+"-retry"
			}
			if g.ex == liveness {
				g.emit(c) // adjacent: the two copies race in parallel batches and processes
				break
			}
			g.delay(c)
		}
		if g.r.Float64() < g.cfg.malformed {
			g.emit(g.malformedMessage(i))
		}
		g.release(false)
	}
	g.release(true)
	return g.out
}

func (g *generator) emit(m message) {
	m.ex = g.ex
	m.hash = sha256.Sum256(m.body)
	g.out = append(g.out, m)
}

// delay queues a copy to come 1 to 50 messages later.
func (g *generator) delay(m message) {
	g.later = append(g.later, delayed{at: len(g.out) + g.r.IntN(50), m: m})
}

// release emits the copies whose time has come (all of them at the end).
func (g *generator) release(all bool) {
	keep := g.later[:0]
	for _, d := range g.later {
		if all || d.at <= len(g.out) {
			g.emit(d.m)
		} else {
			keep = append(keep, d)
		}
	}
	g.later = keep
}

var currencies = []string{"EUR", "USD", "GBP"}

// valid returns the i-th valid message of the example.
func (g *generator) valid(i int) message {
	switch g.ex {
	case quickstart:
		account := fmt.Sprintf("A%d", g.r.IntN(20)+1)
		return message{kind: kindValid, id: fmt.Sprintf("%s-dep-%d", g.run, i), key: account,
			body: fmt.Appendf(nil, `{"account":%q,"amount":%d}`, account, g.r.IntN(100)+1)}
	case liveness:
		account := fmt.Sprintf("L%d", g.r.IntN(hotAccounts)+1)
		return message{kind: kindValid, id: fmt.Sprintf("%s-liv-%d", g.run, i), key: account,
			body: soakworker.Body(account, int64(g.r.IntN(100)+1), "")}
	case payments:
		cr := fmt.Sprintf("%s-cr-%d", g.run, i)
		return message{kind: kindValid, id: fmt.Sprintf("%s-pay-%d", g.run, i), corr: fmt.Sprintf("%s-corr-%d", g.run, i), key: cr,
			body: captureBody(cr, fmt.Sprintf("o-%d", i), int64(g.r.IntN(100000)+100), currencies[i%len(currencies)])}
	default:
		ev := g.nextEvent()
		body, _ := json.Marshal(ev)
		return message{kind: kindValid, id: fmt.Sprintf("%s-evt-%s-%d", g.run, ev.OrderID, ev.Version), key: ev.OrderID, body: body}
	}
}

func captureBody(cr, order string, amount int64, currency string) []byte {
	return fmt.Appendf(nil, `{"schemaVersion":1,"captureRequestId":%q,"orderId":%q,"amount":%d,"currency":%q}`,
		cr, order, amount, currency)
}

// nextEvent interleaves the events of 64 orders in progress, each placed,
// paid and shipped; in 2% of the orders shipped comes before paid (a version
// gap, then a stale event).
func (g *generator) nextEvent() orderEvent {
	for len(g.active) < 64 {
		g.order++
		id := fmt.Sprintf("o-%d", g.order)
		evs := []orderEvent{{id, 1, "OrderPlaced"}, {id, 2, "OrderPaid"}, {id, 3, "OrderShipped"}}
		if g.r.Float64() < 0.02 {
			evs[1], evs[2] = evs[2], evs[1]
		}
		g.active = append(g.active, evs)
	}
	i := g.r.IntN(len(g.active))
	ev := g.active[i][0]
	if g.active[i] = g.active[i][1:]; len(g.active[i]) == 0 {
		g.active = append(g.active[:i], g.active[i+1:]...)
	}
	return ev
}

// conflicting returns a message that conflicts with the valid message m.
func (g *generator) conflicting(m message) message {
	c := m
	c.kind, c.probe = kindConflict, false
	switch g.ex {
	case quickstart, liveness:
		var d struct {
			Account string `json:"account"`
			Amount  int64  `json:"amount"`
		}
		_ = json.Unmarshal(m.body, &d)
		c.body = fmt.Appendf(nil, `{"account":%q,"amount":%d}`, d.Account, d.Amount+1000)
	case payments:
		var b struct {
			CR       string `json:"captureRequestId"`
			Order    string `json:"orderId"`
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		}
		_ = json.Unmarshal(m.body, &b)
		if g.r.IntN(2) == 0 {
			c.body = captureBody(b.CR, b.Order, b.Amount+1, b.Currency)
		} else {
			c.kind, c.id = kindCaptureConflict, m.id+"-cc"
			c.body = captureBody(b.CR, b.Order, b.Amount+7, b.Currency)
		}
	default:
		var ev orderEvent
		_ = json.Unmarshal(m.body, &ev)
		// Were it ever applied, version+100 would show in the projection.
		c.body, _ = json.Marshal(orderEvent{ev.OrderID, ev.Version + 100, "OrderShipped"})
	}
	return c
}

// malformedMessage returns the i-th message that can never be processed,
// rotating through the example's ways of being wrong.
func (g *generator) malformedMessage(i int) message {
	id := fmt.Sprintf("%s-bad-%s-%d", g.run, g.ex, i)
	m := message{kind: kindMalformed, id: id}
	switch g.ex {
	case quickstart, liveness:
		switch g.r.IntN(3) {
		case 0:
			m.body, m.reason = fmt.Appendf(nil, `{"account":"A1","soak":%q,"amount":`, id), "decode_error"
		case 1:
			m.body, m.reason = fmt.Appendf(nil, `{"account":"A1","soak":%q}`, id), "invalid_deposit"
		default:
			m.id, m.body, m.reason = "", fmt.Appendf(nil, `{"account":"A1","amount":1,"soak":%q}`, id), "missing_message_id"
		}
	case payments:
		m.corr = id + "-corr"
		cr := id + "-cr"
		switch g.r.IntN(5) {
		case 0:
			m.corr, m.body, m.reason = "", captureBody(cr, "o-bad", 100, "EUR"), "invalid_envelope"
		case 1:
			m.body, m.reason = fmt.Appendf(nil, `{"schemaVersion":2,"captureRequestId":%q,"orderId":"o-bad","amount":100,"currency":"EUR"}`, cr), "invalid_envelope"
		case 2:
			m.body, m.reason = fmt.Appendf(nil, `{"schemaVersion":1,"captureRequestId":%q,"amount":`, cr), "invalid_envelope"
		case 3:
			m.body, m.reason = fmt.Appendf(nil, `{"schemaVersion":1,"captureRequestId":%q,"orderId":"o-bad","currency":"EUR"}`, cr), "invalid_envelope"
		default:
			m.id, m.body, m.reason = "", captureBody(cr, "o-bad", 100, "EUR"), "missing_message_id"
		}
	default:
		order := fmt.Sprintf("bad-%d", i)
		switch g.r.IntN(3) {
		case 0:
			m.body, m.reason = fmt.Appendf(nil, `{"orderId":%q,"version":`, order), "decode_error"
		case 1:
			m.body, m.reason = fmt.Appendf(nil, `{"orderId":%q,"version":1,"type":"OrderLost"}`, order), "invalid_event"
		default:
			m.id, m.body, m.reason = "", fmt.Appendf(nil, `{"orderId":%q,"version":1,"type":"OrderPlaced"}`, order), "missing_message_id"
		}
	}
	return m
}

// copyGap is the longest time between the publishing of two copies of one
// message id (a duplicate or a conflicting payload after its original) at
// rate: the publisher sends message i of the plan i/rate after it starts.
func (p plan) copyGap(rate float64) time.Duration {
	most := 0
	for i, m := range p.msgs {
		if m.kind == kindDup || m.kind == kindConflict {
			most = max(most, i-m.of)
		}
	}
	return time.Duration(float64(most) / rate * float64(time.Second))
}

// estimate is how long publishing p at rate takes.
func (p plan) estimate(rate float64) time.Duration {
	return time.Duration(float64(len(p.msgs)) / rate * float64(time.Second))
}
