package main

import (
	"errors"
	"flag"
	"io"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzParseDuration: a duration flag (--older-than, --floor) is a Go
// duration or whole days followed by one. What parses is exactly the
// days and the rest added up, never a value wrapped around the int64 range
// (which would turn 200000d into minutes and delete far too much), and it
// reads back the same from its own spellings: d.String() and "Nd" plus the
// rest.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"30d", "7d12h", "0d", "1d30m", "90s", "168h", "1h30m", "-5m", "d", "1.5d", "1d-1h",
		"1d+1h", "99999999d", "106751d", "106752d", "213504d", "1048576d", "106751d23h47m16.854775807s",
		"106751d23h47m16.854775808s", "2562047h47m16.854775807s", "1d2562047h", "01d", "+1d", "1d0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseDuration(s)
		days, rest, withDays := strings.Cut(s, "d")
		if !withDays {
			want, werr := time.ParseDuration(s)
			if (err == nil) != (werr == nil) || d != want {
				t.Fatalf("%q: (%v, %v), time.ParseDuration says (%v, %v)", s, d, err, want, werr)
			}
		} else if err == nil {
			n, nerr := strconv.ParseUint(days, 10, 64)
			r := time.Duration(0)
			if rest != "" {
				r, _ = time.ParseDuration(rest)
			}
			want := new(big.Int).Mul(new(big.Int).SetUint64(n), big.NewInt(int64(day)))
			want.Add(want, big.NewInt(int64(r)))
			if nerr != nil || r < 0 || !want.IsInt64() || want.Int64() != int64(d) {
				t.Fatalf("%q: read as %d ns, but %s days and %q are %s ns", s, d, days, rest, want)
			}
		}
		if err != nil {
			if err.Error() != "not a duration such as 90s, 30m, 168h or 30d" && err != errTooLong {
				t.Fatalf("%q: %v", s, err)
			}
			return
		}
		if again, err := parseDuration(d.String()); err != nil || again != d {
			t.Fatalf("%q: %v reads back as (%v, %v)", s, d, again, err)
		}
		if d < 0 {
			return
		}
		spelt := strconv.FormatInt(int64(d/day), 10) + "d" + (d % day).String()
		if again, err := parseDuration(spelt); err != nil || again != d {
			t.Fatalf("%q: %v spelt %q reads back as (%v, %v)", s, d, spelt, again, err)
		}
	})
}

// listFlags are the filter flags of a list command, parsed.
type listFlags struct {
	consumer, reason, schema string
	limit                    int
	olderThan                time.Duration
	json                     bool
	positional               []string
}

// parseList parses args as a list command does: its shared flags, filters
// of each kind (text, a whole number, a duration, a boolean) and any
// positional arguments.
func parseList(args []string) (listFlags, error) {
	e := &env{stdout: io.Discard, stderr: io.Discard}
	fs := e.flags("deadletters list")
	var l listFlags
	fs.StringVar(&l.consumer, "consumer", "", "")
	fs.StringVar(&l.reason, "reason", "", "")
	intFlag(fs, &l.limit, "limit", 50, 1, "")
	durationFlag(fs, &l.olderThan, "older-than", 0, 1, "")
	e.jsonFlag(fs)
	rest, err := e.parseArgs(fs, args)
	l.schema, l.json, l.positional = e.tables.Schema, e.json, rest
	return l, err
}

// spelt writes l back as arguments, each flag as --name=value.
func (l listFlags) spelt() []string {
	args := []string{"--consumer=" + l.consumer, "--reason=" + l.reason, "--schema=" + l.schema,
		"--limit=" + strconv.Itoa(l.limit), "--json=" + strconv.FormatBool(l.json)}
	if l.olderThan != 0 { // unset: 0 is below the flag's minimum
		args = append(args, "--older-than="+l.olderThan.String())
	}
	return append(append(args, "--"), l.positional...)
}

// FuzzParseFilterFlags: a command's filters parse to the values given,
// whether spelt --name value or --name=value, between positional arguments
// kept in their order; a bad value or an unknown flag is errUsage; help is
// asked for by a help flag, never by a filter's value (--reason -h filters
// by the reason "-h").
func FuzzParseFilterFlags(f *testing.F) {
	for _, s := range []string{
		"--consumer\nbilling\n--limit=5\npos", "--reason\nhelp", "--consumer\n-h", "help", "--json\nx\n--\n--limit",
		"--older-than\n30d\n--schema\nidem", "--limit\n-1", "--nope", "--consumer", "---consumer\nx", "-\n", "--limit\n0x10",
		"--schema\na b", "--older-than=106752d", "--help=x", "--limit\nx\n-h",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, joined string) {
		args := strings.Split(joined, "\n")
		l, err := parseList(args)
		if err != nil {
			switch {
			case errors.Is(err, flag.ErrHelp) && !asksForHelp(args):
				t.Fatalf("%q: help, but no help flag", args)
			case !errors.Is(err, errUsage) && !errors.Is(err, flag.ErrHelp):
				t.Fatalf("%q: %v is neither errUsage nor flag.ErrHelp", args, err)
			}
			return
		}
		if asksForHelp(args) {
			t.Fatalf("%q: a help flag, read as %+v", args, l)
		}
		if l.limit < 1 || l.olderThan < 0 {
			t.Fatalf("%q: out of range: %+v", args, l)
		}
		again, err := parseList(l.spelt())
		if err != nil || !reflect.DeepEqual(again, l) {
			t.Fatalf("%q: read as %+v, spelt %q, read again as %+v (%v)", args, l, l.spelt(), again, err)
		}
	})
}

// asksForHelp is the grammar of the command line read independently: a
// flag named h or help, before any "--", that is not the value of the flag
// before it.
func asksForHelp(args []string) bool {
	takesValue := map[string]bool{"consumer": true, "reason": true, "limit": true, "older-than": true, "schema": true,
		"prefix": true, "pg-url": true}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return false
		}
		if len(a) < 2 || a[0] != '-' {
			continue
		}
		name, _, inline := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		switch {
		case name == "h" || name == "help":
			return true
		case !inline && takesValue[name]:
			i++ // its value
		}
	}
	return false
}
