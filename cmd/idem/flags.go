package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// parse parses args with fs, flags before, between and after the
// positional arguments (a "--" ends the flags), and stores the positional
// arguments in positional, which must match them in number. A help flag
// prints the usage to stdout and returns flag.ErrHelp, which exits 0; an
// unknown flag, a bad value (see atLeast), a bad --schema or --prefix and a
// missing or extra argument are errUsage, which exits 2.
func (e *env) parse(fs *flag.FlagSet, args []string, positional ...*string) error {
	rest, err := e.parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(rest) < len(positional):
		return fmt.Errorf("%w: missing argument; see '%s --help'", errUsage, fs.Name())
	case len(rest) > len(positional):
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, rest[len(positional):])
	}
	for i, p := range positional {
		*p = rest[i]
	}
	return nil
}

// parseArgs is parse for a command that takes any number of positional
// arguments: it returns them.
func (e *env) parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	if wantsHelp(args) {
		fs.SetOutput(e.stdout)
	} else {
		// A bad flag is reported once, by run, with a pointer to --help.
		fs.SetOutput(io.Discard)
	}
	flags, rest := splitFlags(fs, args)
	if err := fs.Parse(flags); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w; see 'idem %s --help'", errUsage, err, strings.TrimPrefix(fs.Name(), "idem "))
	}
	if e.operator != nil && *e.operator == "" {
		*e.operator = currentUser()
	}
	if err := e.tables.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	return rest, nil
}

// splitFlags separates args into the flags of fs, each with its value, and
// the positional arguments, in their order. A flag's value is the next
// argument unless it is given as --flag=value or the flag is a boolean. An
// unknown flag is kept with the flags, for fs to refuse.
func splitFlags(fs *flag.FlagSet, args []string) (flags, positional []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return flags, append(positional, args[i+1:]...)
		case len(a) < 2 || a[0] != '-':
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name, _, inline := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if f := fs.Lookup(name); f != nil && !inline && !isBool(f) && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return flags, positional
}

// isBool reports whether f takes no value (--json, not --json true).
func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// atLeast is an int or duration flag that refuses values below min: a
// negative --limit is bad usage, not a failure of the command.
type atLeast[T int | time.Duration] struct {
	p     *T
	min   T
	parse func(string) (T, error)
}

// intFlag defines an int flag of at least min.
func intFlag(fs *flag.FlagSet, p *int, name string, value, min int, usage string) {
	*p = value
	fs.Var(atLeast[int]{p: p, min: min, parse: func(s string) (int, error) {
		n, err := strconv.ParseInt(s, 0, strconv.IntSize)
		if err != nil {
			return 0, errors.New("not a whole number")
		}
		return int(n), nil
	}}, name, usage)
}

// durationFlag defines a duration flag of at least min.
func durationFlag(fs *flag.FlagSet, p *time.Duration, name string, value, min time.Duration, usage string) {
	*p = value
	fs.Var(atLeast[time.Duration]{p: p, min: min, parse: parseDuration}, name, usage)
}

// parseDuration parses a Go duration (90s, 30m, 168h, 1h30m) that may start
// with whole days (30d, 7d12h): a day is 24 hours.
func parseDuration(s string) (time.Duration, error) {
	bad := fmt.Errorf("not a duration such as 90s, 30m, 168h or 30d")
	days, rest, ok := strings.Cut(s, "d")
	if !ok {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, bad
		}
		return d, nil
	}
	n, err := strconv.ParseUint(days, 10, 32)
	if err != nil {
		return 0, bad
	}
	if n > maxDays {
		return 0, errTooLong
	}
	d := time.Duration(n) * day
	if rest != "" {
		r, err := time.ParseDuration(rest)
		if err != nil || r < 0 || strings.HasPrefix(rest, "+") {
			return 0, bad
		}
		if r > math.MaxInt64-d { // the sum would wrap around to a short or negative duration
			return 0, errTooLong
		}
		d += r
	}
	return d, nil
}

// day is the d of a duration flag.
const day = 24 * time.Hour

// maxDays is the most whole days a time.Duration holds (about 292 years).
const maxDays = uint64(math.MaxInt64 / int64(day))

// errTooLong refuses a duration in days that time.Duration cannot hold:
// multiplied out, it would wrap around to a short or negative one.
var errTooLong = fmt.Errorf("longer than %d days", maxDays)

func (f atLeast[T]) String() string {
	if f.p == nil { // the zero flag that flag.PrintDefaults compares with
		var zero T
		return fmt.Sprint(zero)
	}
	return fmt.Sprint(*f.p)
}

func (f atLeast[T]) Set(s string) error {
	v, err := f.parse(s)
	switch {
	case err != nil:
		return err
	case v >= f.min:
		*f.p = v
		return nil
	case f.min == 0:
		return errors.New("must not be negative")
	case f.min == 1:
		return errors.New("must be positive")
	}
	return fmt.Errorf("must be at least %v", f.min)
}
