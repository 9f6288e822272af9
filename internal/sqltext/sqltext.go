// Package sqltext reads what the runtime's handler guard needs from a
// statement's text, without parsing SQL: whether it controls the
// transaction (ControlWord), whether it writes rows (IsWrite), and the row
// a write names as far as its text and arguments name it (RowKey). Its
// functions are pure and allocate little; they run on every statement a
// handler sends.
package sqltext

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
	"strings"
	"time"
)

var keySeed = maphash.MakeSeed()

// RowKey names the row a write statement with args writes.
func RowKey(sql string, args []any) uint64 {
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

// IsWrite reports whether sql starts with a statement that writes rows.
func IsWrite(sql string) bool {
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

// controlWords start statements that end or restructure a transaction.
var controlWords = map[string]bool{
	"BEGIN": true, "START": true, "COMMIT": true, "END": true, "ROLLBACK": true,
	"ABORT": true, "SAVEPOINT": true, "RELEASE": true,
}

// ControlWord reports whether any statement in sql is transaction
// control, and its first word. It skips comments, string literals, quoted
// identifiers and dollar-quoted bodies, so that `DO $$ BEGIN … END $$` and
// `SELECT 'commit'` pass.
func ControlWord(sql string) (string, bool) {
	start := true // at the start of a statement
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			i++
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			i = skipBlockComment(sql, i)
		case c == ';':
			start = true
			i++
		case start && isLetter(c):
			j := i
			for j < len(sql) && (isLetter(sql[j]) || sql[j] == '_') {
				j++
			}
			word := strings.ToUpper(sql[i:j])
			if controlWords[word] || word == "PREPARE" && nextWord(sql, j) == "TRANSACTION" {
				return word, true
			}
			start = false
			i = j
		default:
			start = false
			i = skipToken(sql, i)
		}
	}
	return "", false
}

// skipToken skips the literal, identifier or character at i.
func skipToken(sql string, i int) int {
	switch c := sql[i]; {
	case c == '\'':
		escapes := i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e')
		return skipQuoted(sql, i, '\'', escapes)
	case c == '"':
		return skipQuoted(sql, i, '"', false)
	case c == '$':
		if tag, ok := dollarTag(sql, i); ok {
			if end := strings.Index(sql[i+len(tag):], tag); end >= 0 {
				return i + len(tag) + end + len(tag)
			}
			return len(sql)
		}
	case isLetter(c) || c == '_':
		j := i
		for j < len(sql) && (isLetter(sql[j]) || sql[j] == '_' || sql[j] >= '0' && sql[j] <= '9' || sql[j] == '$') {
			j++
		}
		return j
	}
	return i + 1
}

// skipQuoted skips a quoted literal or identifier starting at i; a doubled
// quote is an escaped one, and so is a backslash-escaped one in E'…'.
func skipQuoted(sql string, i int, q byte, backslash bool) int {
	for j := i + 1; j < len(sql); j++ {
		switch {
		case backslash && sql[j] == '\\':
			j++
		case sql[j] == q && j+1 < len(sql) && sql[j+1] == q:
			j++
		case sql[j] == q:
			return j + 1
		}
	}
	return len(sql)
}

// skipBlockComment skips a (nestable) /* … */ comment starting at i.
func skipBlockComment(sql string, i int) int {
	depth := 0
	for i < len(sql) {
		switch {
		case strings.HasPrefix(sql[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(sql[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return i
}

// dollarTag returns the $tag$ opening a dollar-quoted string at i.
func dollarTag(sql string, i int) (string, bool) {
	j := i + 1
	if j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
		return "", false // a parameter: $1
	}
	for j < len(sql) && (isLetter(sql[j]) || sql[j] == '_' || sql[j] >= '0' && sql[j] <= '9') {
		j++
	}
	if j < len(sql) && sql[j] == '$' {
		return sql[i : j+1], true
	}
	return "", false
}

func nextWord(sql string, i int) string {
	for i < len(sql) && (sql[i] == ' ' || sql[i] == '\t' || sql[i] == '\n' || sql[i] == '\r') {
		i++
	}
	j := i
	for j < len(sql) && isLetter(sql[j]) {
		j++
	}
	return strings.ToUpper(sql[i:j])
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80 }
