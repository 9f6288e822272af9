package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
)

// The resolve commands (ledger resolve, http-keys resolve) act on the
// records named as arguments, or on every record a filter selects with
// --all, and say what they did with each, as they go.

// selection is what a resolve command was asked to act on.
type selection struct {
	ids []string
	all bool
	// state is --status (--state); with ids, the state each must still be in.
	state string
	// narrowing names the filter flags set besides it (--type, --consumer, …).
	narrowing []string
}

// newSelection reads the selection of fs, parsed, whose filter flags
// besides stateFlag are narrowing.
func newSelection(fs *flag.FlagSet, ids []string, all bool, state string, narrowing ...string) selection {
	s := selection{ids: ids, all: all, state: state}
	fs.Visit(func(f *flag.Flag) {
		for _, n := range narrowing {
			if f.Name == n {
				s.narrowing = append(s.narrowing, "--"+n)
			}
		}
	})
	return s
}

// check refuses a selection that is ambiguous or broader than a status:
// a filter resolves nothing without --all, and --all nothing without a
// status.
func (s selection) check(stateFlag, noun string) error {
	switch {
	case len(s.ids) > 0 && s.all:
		return fmt.Errorf("%w: give %s ids or --all, not both", errUsage, noun)
	case len(s.ids) > 0 && len(s.narrowing) > 0:
		return fmt.Errorf("%w: %s narrow --all; with ids, only %s applies (each must still be in it)",
			errUsage, strings.Join(s.narrowing, ", "), stateFlag)
	case len(s.ids) == 0 && !s.all && s.state == "" && len(s.narrowing) == 0:
		return fmt.Errorf("%w: missing argument: give %s ids, or %s S --all", errUsage, noun, stateFlag)
	case len(s.ids) == 0 && !s.all:
		return fmt.Errorf("%w: a filter selects every %s it matches: add --all to resolve them all", errUsage, noun)
	case s.all && s.state == "":
		return fmt.Errorf("%w: --all needs %s: a resolve never acts on %ss of every state at once", errUsage, stateFlag, noun)
	}
	return nil
}

// resolveOutput prints what a resolve command did with each record as it
// goes: a line each, or an element of a JSON array with --json.
type resolveOutput struct {
	e        *env
	noun     string // "effect", "key"
	operator string
	// all is --all: the summary line is printed whatever the count.
	all     bool
	json    *jsonArray
	n       int
	refused int
	last    error // the last refusal
}

func (e *env) resolveOutput(noun, operator string, all bool) *resolveOutput {
	o := &resolveOutput{e: e, noun: noun, operator: operator, all: all}
	if e.json {
		o.json = &jsonArray{e: e}
	}
	return o
}

// add prints the outcome of one record: resolved into state to, or
// refused for err (prefix, the library's context, cut from the line); j is
// its JSON element.
func (o *resolveOutput) add(id, to string, err error, prefix string, j any) error {
	o.n++
	if err != nil {
		o.refused++
		o.last = err
	}
	switch {
	case o.json != nil:
		return o.json.add(j)
	case err != nil:
		o.e.printf("%s %s refused: %s\n", o.noun, id, strings.TrimPrefix(err.Error(), prefix))
	default:
		o.e.printf("%s %s is now %s (audited as %s)\n", o.noun, id, to, o.operator)
	}
	return nil
}

// close ends the output after a run that stopped with err (nil when it
// went through): a summary line for --all or more than one record,
// and an error when any was refused, which exits 1.
func (o *resolveOutput) close(err error) error {
	if o.json != nil {
		if jerr := o.json.close(); jerr != nil {
			return errors.Join(err, jerr)
		}
	} else if o.n != 1 || o.all {
		o.e.printf("resolved %d of %d %ss; %d refused\n", o.n-o.refused, o.n, o.noun, o.refused)
	}
	switch {
	case err != nil:
		return fmt.Errorf("%w (stopped after %d %ss: %d resolved, %d refused)", err, o.n, o.noun, o.n-o.refused, o.refused)
	case o.refused == 1 && o.n == 1:
		return o.last
	case o.refused > 0:
		return fmt.Errorf("%d of %d %ss refused, the last: %w", o.refused, o.n, o.noun, o.last)
	}
	return nil
}

// jsonText is s, or nil for "".
func jsonText(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// errText is err's text, or nil.
func errText(err error) *string {
	if err == nil {
		return nil
	}
	return jsonText(err.Error())
}
