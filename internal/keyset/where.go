package keyset

import (
	"fmt"
	"strings"
)

// Where builds the conditions of a listing from the filters that are set.
// A filter left empty adds no condition at all, rather than a condition
// that is true when its argument is empty (status = $1 OR $1 is empty),
// which a generic plan must keep as it is: the
// planner sees only what selects rows, and walks the index that matches
// it from the cursor, so a page reads what it returns.
type Where struct {
	conds []string
	// Args are the statement's arguments, in placeholder order.
	Args []any
}

// Arg adds v to the arguments and returns its placeholder ($n).
func (w *Where) Arg(v any) string {
	w.Args = append(w.Args, v)
	return fmt.Sprintf("$%d", len(w.Args))
}

// Equal adds `col = v` when v is not empty.
func (w *Where) Equal(col, v string) {
	if v != "" {
		w.Add(col + " = " + w.Arg(v))
	}
}

// Leading adds the condition on the leading column of the index a listing
// is to walk, `col = ANY(ARRAY[v])`, and returns the ORDER BY prefix that
// goes with it ("col DESC, " or "col, "). With a plain `col = v` the
// planner drops col from the order, since it is constant, and may then walk
// the primary key instead, filtering out every row of the other values: a
// page of a value with one row in eight reads eight. Written as ANY, col
// stays in the order, which only the index led by col gives.
func (w *Where) Leading(col, v string, desc bool) string {
	w.Add(col + " = ANY(ARRAY[" + w.Arg(v) + "::text])")
	if desc {
		return col + " DESC, "
	}
	return col + ", "
}

// Add adds a condition, whose placeholders come from Arg.
func (w *Where) Add(cond string) { w.conds = append(w.conds, cond) }

// After adds the keyset condition `(at, id) > (t, id)` of the cursor c
// (Encode's), for a listing in (at, id) order, when c is set; castID is the
// id's SQL type (text, bytea) and parseID turns the cursor's id into its
// value. An error wraps ErrCursor.
func (w *Where) After(c, at, id, castID string, parseID func(string) (any, error)) error {
	if c == "" {
		return nil
	}
	t, raw, err := Decode(c)
	if err != nil {
		return err
	}
	v, err := parseID(raw)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCursor, err)
	}
	w.Add(fmt.Sprintf("(%s, %s) > (%s::timestamptz, %s::%s)", at, id, w.Arg(t), w.Arg(v), castID))
	return nil
}

// SQL returns " WHERE c1 AND c2 …", or "" when no condition was added.
func (w *Where) SQL() string {
	if len(w.conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(w.conds, " AND ")
}
