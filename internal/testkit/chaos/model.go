package main

import (
	"fmt"
	"strconv"
	"time"
)

// Dead-letter reasons of the chaos workers: a body canonical JSON refuses;
// a charge the ledger refuses (another request under its effect id).
const (
	reasonDecode         = "decode_error"
	reasonEffectConflict = "effect_conflict"
)

// depositMsg is a main-queue message as published.
type depositMsg struct {
	id       string // canonical id
	spelling string // how a numeric id is written; empty: a string id
	amount   int64
	charge   string
}

// body is the message's JSON body.
func (d depositMsg) body() []byte {
	id := strconv.Quote(d.id)
	if d.spelling != "" {
		id = d.spelling
	}
	if d.charge != "" {
		return []byte(fmt.Sprintf(`{"id":%s,"amount":%d,"charge":%q}`, id, d.amount, d.charge))
	}
	return []byte(fmt.Sprintf(`{"id":%s,"amount":%d}`, id, d.amount))
}

// model is what the schedule published: what the oracle expects.
type model struct {
	originals   map[string]depositMsg    // by id: the first message published under it
	amounts     map[string]map[int64]int // by id: payloads published (by amount), times
	charges     map[string]string        // by id: the behaviour of its charge
	keyedSeqs   map[string][]int         // by key: seqs in publish order
	partSeqs    map[string][]int         // by key of the partitioned queue: seqs in publish order
	refusals    map[string]int           // by reason: bad messages published
	redriven    int                      // dead letters an operator moved back
	forgotten   map[string]bool          // ids whose inbox row a cleanup deleted
	keyAmount   map[string]int64         // by Idempotency-Key: the amount of its first request
	answers     map[string][]answer      // by Idempotency-Key: what each request got
	lastAt      map[string]time.Time     // by Idempotency-Key: when its last request was sent
	stream      []depositMsg             // published to the stream, in order
	undecodable map[string]bool          // ids of the messages published undecodable: true once a redrive may have sent one back
	counter     int
}

func newModel() *model {
	return &model{originals: map[string]depositMsg{}, amounts: map[string]map[int64]int{}, charges: map[string]string{},
		keyedSeqs: map[string][]int{}, partSeqs: map[string][]int{}, refusals: map[string]int{}, forgotten: map[string]bool{},
		keyAmount: map[string]int64{}, answers: map[string][]answer{}, lastAt: map[string]time.Time{}, undecodable: map[string]bool{}}
}

// next is a number for a bad message's body, unique in the run.
func (m *model) next() int {
	m.counter++
	return m.counter
}

func (m *model) deposit(d depositMsg, original bool) {
	if original {
		if _, ok := m.originals[d.id]; !ok {
			m.originals[d.id] = d
		}
	}
	if m.amounts[d.id] == nil {
		m.amounts[d.id] = map[int64]int{}
	}
	m.amounts[d.id][d.amount]++
	if d.charge != "" {
		m.charges[d.id] = d.charge
	}
}

func (m *model) keyed(key string, seq int) { m.keyedSeqs[key] = append(m.keyedSeqs[key], seq) }

func (m *model) refused(reason string) { m.refusals[reason]++ }
