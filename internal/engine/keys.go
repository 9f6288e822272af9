package engine

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// writeKeys is the in-process table of the rows that batches in flight
// have written, as far as the runtime can name a row without parsing SQL: a
// write statement's text with all its arguments. Two handlers that run the
// same statement with the same arguments (UPDATE accounts SET balance =
// balance + 1 WHERE id = $1, with one account) write the same row; the
// second would wait for the first batch to commit, or deadlock with it.
// Instead, a message whose first write names a row another batch in flight
// already wrote is postponed: nothing of it was written yet, so it leaves
// its batch and runs in a later one. Statements that differ in any argument
// get different keys, so the table never postpones on a guess; conflicts it
// cannot name are left to PostgreSQL (lock_timeout, then a retry).
//
// A message that cannot be postponed (it wrote already, or was postponed
// often enough) writes the row anyway, after the other batch's lock: its
// batch then holds the row too, and the key stays in the table until every
// batch that holds it has ended, so that no third batch takes the row for
// free and waits on a lock the table does not show.
type writeKeys struct {
	mu   sync.Mutex
	rows map[uint64]holders
}

// holders are the batches in flight that wrote one row: first, and, rarely,
// more that wrote it after first's lock.
type holders struct {
	first *batch
	more  []*batch
}

func newWriteKeys() *writeKeys { return &writeKeys{rows: map[uint64]holders{}} }

// take records that b writes the row named key, and reports whether b
// holds it alone: no other batch in flight wrote it. When another did, b is
// recorded only if force (it writes the row anyway). An abandoned batch is
// never recorded: its keys were released for good.
func (k *writeKeys) take(b *batch, key uint64, force bool) (alone bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if b.gone {
		return true
	}
	h, ok := k.rows[key]
	switch {
	case !ok:
		k.rows[key] = holders{first: b}
		return true
	case h.first == b && len(h.more) == 0:
		return true
	case force && h.first != b && !slices.Contains(h.more, b):
		h.more = append(h.more, b)
		k.rows[key] = h
	}
	return false
}

// release forgets that b holds the rows named keys: its transaction ended.
func (k *writeKeys) release(b *batch, keys []uint64) {
	if len(keys) == 0 {
		return
	}
	k.mu.Lock()
	for _, key := range keys {
		k.drop(b, key)
	}
	k.mu.Unlock()
}

// abandon marks b abandoned and forgets every row it holds, from another
// goroutine than b's own: its handler still runs, and whatever it writes
// from now on is not recorded (its backend is being terminated).
func (k *writeKeys) abandon(b *batch) {
	k.mu.Lock()
	b.gone = true
	for key, h := range k.rows {
		if h.first == b || slices.Contains(h.more, b) {
			k.drop(b, key)
		}
	}
	k.mu.Unlock()
}

// drop removes b from the holders of key; mu must be held.
func (k *writeKeys) drop(b *batch, key uint64) {
	h, ok := k.rows[key]
	if !ok {
		return
	}
	if h.first == b {
		if len(h.more) == 0 {
			delete(k.rows, key)
			return
		}
		h.first, h.more = h.more[0], h.more[1:]
	} else {
		h.more = slices.DeleteFunc(h.more, func(o *batch) bool { return o == b })
	}
	k.rows[key] = h
}

// held is how many rows the table holds (tests).
func (k *writeKeys) held() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.rows)
}

var keySeed = maphash.MakeSeed()

// rowKey names the row a write statement with args writes.
func rowKey(sql string, args []any) uint64 {
	var h maphash.Hash
	h.SetSeed(keySeed)
	h.WriteString(sql)
	var buf [8]byte
	for _, a := range args {
		h.WriteByte(0)
		switch v := a.(type) {
		case string:
			h.WriteString(v)
		case []byte:
			h.Write(v)
		case int:
			h.Write(binary.LittleEndian.AppendUint64(buf[:0], uint64(v)))
		case int32:
			h.Write(binary.LittleEndian.AppendUint64(buf[:0], uint64(v)))
		case int64:
			h.Write(binary.LittleEndian.AppendUint64(buf[:0], uint64(v)))
		case float64:
			h.Write(binary.LittleEndian.AppendUint64(buf[:0], math.Float64bits(v)))
		case bool:
			if v {
				h.WriteByte(1)
			}
		case time.Time:
			h.Write(binary.LittleEndian.AppendUint64(buf[:0], uint64(v.UnixNano())))
		case nil:
			h.WriteByte(0xff)
		default:
			fmt.Fprint(&h, v)
		}
	}
	return h.Sum64()
}

// isWrite reports whether sql starts with a statement that writes rows.
func isWrite(sql string) bool {
	w := firstWord(sql)
	return w == "UPDATE" || w == "INSERT" || w == "DELETE" || w == "MERGE"
}

// firstWord is the first keyword of sql, upper-cased, after white space
// and comments.
func firstWord(sql string) string {
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '(':
			i++
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			i = skipBlockComment(sql, i)
		default:
			j := i
			for j < len(sql) && isLetter(sql[j]) {
				j++
			}
			return strings.ToUpper(sql[i:j])
		}
	}
	return ""
}
