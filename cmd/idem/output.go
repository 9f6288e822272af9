package main

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"text/tabwriter"

	"github.com/idemkit/idem/internal/safetext"
)

// Every text line the commands print goes through printf or a table, which
// escape what they print with safetext.Display: ids, reasons, errors and
// keys come from producers and handlers, and must neither steer the
// operator's terminal nor forge a line or a column. --json needs no
// escaping: JSON strings escape control characters themselves.

// table prints rows of cells aligned in columns on e.stdout.
type table struct{ w *tabwriter.Writer }

func (e *env) table() *table { return &table{w: tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)} }

// row prints a row: each cell as fmt.Sprint prints it, escaped.
func (t *table) row(cells ...any) {
	out := make([]string, len(cells))
	for i, c := range cells {
		out[i] = safetext.Display(fmt.Sprint(c))
	}
	fmt.Fprintln(t.w, strings.Join(out, "\t"))
}

// flush prints what the rows left aligned.
func (t *table) flush() error { return t.w.Flush() }

// printf prints on e.stdout with each string (of any string type) and
// error argument escaped.
func (e *env) printf(format string, args ...any) {
	for i, a := range args {
		if err, ok := a.(error); ok {
			args[i] = safetext.Display(err.Error())
		} else if v := reflect.ValueOf(a); v.Kind() == reflect.String {
			args[i] = safetext.Display(v.String())
		}
	}
	fmt.Fprintf(e.stdout, format, args...)
}

// writeJSON prints v as indented JSON.
func (e *env) writeJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printRows prints the rows of a list command: a JSON array of asJSON's
// values with --json, else a table of the tab-separated header and the
// cells of each row.
func printRows[R, J any](e *env, rows []R, asJSON func(R) J, header string, cells func(R) []any) error {
	if e.json {
		out := make([]J, len(rows))
		for i, r := range rows {
			out[i] = asJSON(r)
		}
		return e.writeJSON(out)
	}
	t := e.table()
	var head []any
	for _, h := range strings.Split(header, "\t") {
		head = append(head, h)
	}
	t.row(head...)
	for _, r := range rows {
		t.row(cells(r)...)
	}
	return t.flush()
}

// jsonArray prints a JSON array one element at a time, as writeJSON
// prints a slice, so that a long run needs no memory for its output.
type jsonArray struct {
	e *env
	n int
}

// add prints v as the array's next element.
func (a *jsonArray) add(v any) error {
	b, err := json.MarshalIndent(v, "  ", "  ")
	if err != nil {
		return err
	}
	sep := ",\n  "
	if a.n == 0 {
		sep = "[\n  "
	}
	a.n++
	_, err = fmt.Fprintf(a.e.stdout, "%s%s", sep, b)
	return err
}

// close ends the array.
func (a *jsonArray) close() error {
	end := "\n]\n"
	if a.n == 0 {
		end = "[]\n"
	}
	_, err := fmt.Fprint(a.e.stdout, end)
	return err
}

// nextPage tells, on stderr, how to list the page after a full one: the
// flag and value to add to the command.
func (e *env) nextPage(flagAndValue string) {
	fmt.Fprintf(e.stderr, "more may follow: add %s for the next page\n", safetext.Display(flagAndValue))
}

// approx formats a count, with a ~ when it is the planner's estimate.
func approx(n int64, estimated bool) string {
	if estimated {
		return fmt.Sprintf("~%d", n)
	}
	return fmt.Sprint(n)
}
