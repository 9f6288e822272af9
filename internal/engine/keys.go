package engine

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
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
type writeKeys struct {
	mu    sync.Mutex
	owner map[uint64]*batch
}

func newWriteKeys() *writeKeys { return &writeKeys{owner: map[uint64]*batch{}} }

// take records that b writes the row named key, and reports false when
// another batch in flight did.
func (k *writeKeys) take(b *batch, key uint64) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if o, ok := k.owner[key]; ok && o != b {
		return false
	}
	k.owner[key] = b
	return true
}

// release forgets the keys b took: its transaction ended.
func (k *writeKeys) release(b *batch, keys []uint64) {
	if len(keys) == 0 {
		return
	}
	k.mu.Lock()
	for _, key := range keys {
		if k.owner[key] == b {
			delete(k.owner, key)
		}
	}
	k.mu.Unlock()
}

// releaseAll forgets every key b took, from another goroutine than b's own
// (b was abandoned with its handler).
func (k *writeKeys) releaseAll(b *batch) {
	k.mu.Lock()
	for key, o := range k.owner {
		if o == b {
			delete(k.owner, key)
		}
	}
	k.mu.Unlock()
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
