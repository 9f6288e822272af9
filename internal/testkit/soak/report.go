package main

import (
	"cmp"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// report is what a soak run found. It is printed as a table and, with
// -json, written as JSON.
type report struct {
	Run    string         `json:"run"`
	Seed   uint64         `json:"seed"`
	Config map[string]any `json:"config"`

	Examples        []exampleReport `json:"examples"`
	Injections      []injection     `json:"injections"`
	Faults          []faultSummary  `json:"faults"`
	Gateway         *gatewayStats   `json:"gateway,omitempty"`
	RetriedCaptures []time.Duration `json:"-"`
	// AppliedBy counts the liveness messages each of its processes applied.
	AppliedBy map[string]int `json:"liveness_applied_by,omitempty"`
	// Crashes counts the worker deaths poison messages caused.
	Crashes int           `json:"poison_crashes"`
	Checks  []checkResult `json:"checks"`

	Messages    int           `json:"messages"`
	PublishTook time.Duration `json:"publish_ns"`
	Took        time.Duration `json:"took_ns"` // first publish to settled
	Throughput  float64       `json:"throughput_msg_per_s"`
	Pass        bool          `json:"pass"`

	finished bool
}

// exampleReport counts one example's load and results.
type exampleReport struct {
	Example         string `json:"example"`
	Published       int    `json:"published"`
	Valid           int    `json:"valid"`
	Duplicates      int    `json:"duplicates"`
	Conflicts       int    `json:"conflicts"`
	Malformed       int    `json:"malformed"`
	Faulty          int    `json:"hung_and_poison"`      // liveness: published by the hang and crash faults
	Forgotten       int    `json:"inbox_rows_forgotten"` // deleted by the retention fault
	Effects         int    `json:"effects"`
	DeadLetters     int    `json:"dead_letters_expected"`
	DeadLetterRows  int    `json:"dead_letter_rows"`
	DeadLetterQueue int    `json:"dead_letter_queue"`
}

// faultSummary is one row of the faults table.
type faultSummary struct {
	Fault    string        `json:"fault"`
	Injected string        `json:"injected"`
	P50      time.Duration `json:"recovery_p50_ns"`
	Max      time.Duration `json:"recovery_max_ns"`
	Measures string        `json:"measures"`
}

// checkResult is one invariant and whether it held.
type checkResult struct {
	Area   string `json:"area"`
	What   string `json:"what"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

func (r *report) check(area, what string, ok bool, detail string) {
	r.Checks = append(r.Checks, checkResult{Area: area, What: what, OK: ok, Detail: detail})
}

func (r *report) fail(area, what, detail string) { r.check(area, what, false, detail) }

func reportConfig(c config) map[string]any {
	return map[string]any{"n": c.n, "rate": c.rate, "dup": c.dup, "conflict": c.conflict, "malformed": c.malformed,
		"faults": c.faults, "fault_every": c.faultEvery.String(), "duration_cap": c.durationCap.String(),
		"examples": exampleList(c.examples)}
}

// finish computes the summaries and the verdict.
func (r *report) finish(cfg config) {
	r.finished = true
	for _, e := range r.Examples {
		r.Messages += e.Published
	}
	if r.Took > 0 {
		r.Throughput = float64(r.Messages) / r.Took.Seconds()
	}
	measures := map[string]string{
		faultKill:        "SIGKILL → a message published after it processed",
		faultConnections: "connections closed → a message published after it processed, in every example",
		faultBackends:    "sessions terminated → a message published after it processed, in every example",
		faultDispatcher:  "SIGKILL with calls in flight → all those captures succeeded (lease " + dispatcherLease.String() + ")",
		faultHang:        "hung handlers published → a message published after them processed",
		faultCrash:       "poison published → it was dead-lettered and a message published after it processed",
		faultCompete:     "two more processes started → a message published after it processed",
		faultRetention:   "inbox cleaned at the floor → a message published after it processed, in every example",
		faultNode:        "node killed → a message published after it processed, in every example",
		faultPGFailover:  "primary stopped → a message published after it processed, in every example",
		faultFreeze:      "node frozen → a message published after it processed, in every example",
	}
	for _, f := range cfg.faults {
		if f == faultGateway {
			continue
		}
		var ds []time.Duration
		n, unmeasured := 0, 0
		for _, inj := range r.Injections {
			if inj.Fault != f || inj.Skipped != "" {
				continue
			}
			n++
			if inj.Recovery > 0 {
				ds = append(ds, inj.Recovery)
			} else if inj.Unmeasured {
				unmeasured++
			}
		}
		s := faultSummary{Fault: f, Injected: fmt.Sprint(n), Measures: measures[f]}
		if unmeasured > 0 {
			s.Injected += fmt.Sprintf(" (%d unmeasured)", unmeasured)
		}
		s.P50, s.Max = quantiles(ds)
		r.Faults = append(r.Faults, s)
	}
	if g := r.Gateway; g != nil && (cfg.has(faultGateway) || cfg.has(faultDispatcher)) {
		s := faultSummary{Fault: "gateway fail / stall / drop", Injected: fmt.Sprintf("%d / %d / %d", g.Failed, g.Slowed, g.Dropped),
			Measures: "capture recorded → succeeded, for captures that needed more than one attempt (gateway faults, killed dispatchers)"}
		s.P50, s.Max = quantiles(r.RetriedCaptures)
		r.Faults = append(r.Faults, s)
	}
	r.Pass = len(r.Checks) > 0 && !slices.ContainsFunc(r.Checks, func(c checkResult) bool { return !c.OK })
}

func quantiles(ds []time.Duration) (p50, max time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	slices.Sort(ds)
	return ds[(len(ds)-1)/2], ds[len(ds)-1]
}

// print writes the tables and the verdict.
func (r *report) print(w io.Writer) {
	r.printLoad(w)
	r.printFaults(w)
	r.printChecks(w)
}

// printLoad writes the run's header and the table of what was published
// and applied, per example.
func (r *report) printLoad(w io.Writer) {
	fmt.Fprintf(w, "\n## idem soak — run %s, seed %d\n\n", r.Run, r.Seed)
	c := r.Config
	faults, _ := c["faults"].([]string)
	fmt.Fprintf(w, "examples %v · faults %s · -n %v -rate %v -dup %v -conflict %v -malformed %v -fault-every %v -duration-cap %v\n\n",
		c["examples"], cmp.Or(strings.Join(faults, ","), "none"), c["n"], c["rate"], c["dup"], c["conflict"], c["malformed"],
		c["fault_every"], c["duration_cap"])

	header := []string{"load"}
	for _, e := range r.Examples {
		header = append(header, e.Example)
	}
	header = append(header, "total")
	rows := [][]string{header}
	row := func(name string, f func(exampleReport) int) {
		cells, total := []string{name}, 0
		for _, e := range r.Examples {
			cells = append(cells, fmt.Sprint(f(e)))
			total += f(e)
		}
		rows = append(rows, append(cells, fmt.Sprint(total)))
	}
	row("messages published", func(e exampleReport) int { return e.Published })
	row("valid messages", func(e exampleReport) int { return e.Valid })
	row("duplicates published (suppressed)", func(e exampleReport) int { return e.Duplicates })
	row("conflicting payloads", func(e exampleReport) int { return e.Conflicts })
	row("malformed", func(e exampleReport) int { return e.Malformed })
	if slices.ContainsFunc(r.Examples, func(e exampleReport) bool { return e.Faulty > 0 }) {
		row("hung and poison (hang, crash faults)", func(e exampleReport) int { return e.Faulty })
	}
	row("effects applied (deposits, payments, events)", func(e exampleReport) int { return e.Effects })
	if slices.ContainsFunc(r.Examples, func(e exampleReport) bool { return e.Forgotten > 0 }) {
		row("inbox rows deleted (retention fault)", func(e exampleReport) int { return e.Forgotten })
	}
	row("dead letters expected", func(e exampleReport) int { return e.DeadLetters })
	row("dead_letters rows", func(e exampleReport) int { return e.DeadLetterRows })
	row("dead-letter queue", func(e exampleReport) int { return e.DeadLetterQueue })
	var numeric []int
	for i := 1; i < len(header); i++ {
		numeric = append(numeric, i)
	}
	table(w, rows, numeric...)
}

// printFaults writes each fault's recovery, every injection and what the
// gateway saw, and the throughput.
func (r *report) printFaults(w io.Writer) {
	if len(r.Faults) > 0 {
		rows := [][]string{{"fault", "injected", "recovery p50", "recovery max", "recovery is"}}
		for _, f := range r.Faults {
			rows = append(rows, []string{f.Fault, f.Injected, dur(f.P50), dur(f.Max), f.Measures})
		}
		table(w, rows, 1, 2, 3)
	}
	for _, inj := range r.Injections {
		state := "recovered in " + dur(inj.Recovery)
		switch {
		case inj.Skipped != "":
			state = "not injected: " + inj.Skipped
		case inj.Unmeasured:
			state = "recovery not measured (nothing published after it)"
		case inj.Recovery == 0:
			state = "NOT RECOVERED"
		}
		if inj.Outcome != "" {
			state += "; " + inj.Outcome
		}
		if inj.Unrestored != "" {
			state += "; NOT PUT BACK: " + inj.Unrestored
		}
		fmt.Fprintf(w, "- %7s  %-11s %-10s %s — %s\n", dur(inj.At), inj.Fault, inj.Target, inj.Detail, state)
		for _, d := range inj.Doors {
			fmt.Fprintf(w, "    - %s %s (exit %d): %s\n", d.Door, d.Target, d.Exit, d.Did)
			for _, p := range d.Problems {
				fmt.Fprintf(w, "      PROBLEM: %s\n", p)
			}
		}
	}
	if r.Crashes > 0 {
		fmt.Fprintf(w, "\npoison messages killed a liveness worker %d times; the supervisor started it again each time\n", r.Crashes)
	}
	if r.Gateway != nil {
		g := r.Gateway
		fmt.Fprintf(w, "\ngateway: %d requests, %d charges, %d distinct captures, %d double charges, %d replays, %d key conflicts, %d failed, %d stalled, %d dropped after charge\n",
			g.Requests, g.Charges, g.Distinct, g.DoubleCharges, g.Replays, g.KeyConflicts, g.Failed, g.Slowed, g.Dropped)
	}
	fmt.Fprintf(w, "\nthroughput: %d messages in %s from first publish to settled (%.0f msg/s); published in %s (%.0f msg/s offered); settled %s after the last publish\n\n",
		r.Messages, dur(r.Took), r.Throughput, dur(r.PublishTook), float64(r.Messages)/max(r.PublishTook.Seconds(), 1e-9), dur(r.Took-r.PublishTook))
}

// printChecks writes the table of checks and the verdict.
func (r *report) printChecks(w io.Writer) {
	rows := [][]string{{"check", "result", "detail"}}
	failed := 0
	for _, c := range r.Checks {
		res := "PASS"
		if !c.OK {
			res, failed = "FAIL", failed+1
		}
		rows = append(rows, []string{c.Area + ": " + c.What, res, c.Detail})
	}
	table(w, rows)
	if r.Pass {
		fmt.Fprintf(w, "**PASS** — %d checks\n", len(r.Checks))
	} else {
		fmt.Fprintf(w, "**FAIL** — %d of %d checks failed\n", failed, len(r.Checks))
	}
	// The plain closing line test runners and CI read.
	fmt.Fprintf(w, "\nsoak: %d passed, %d failed\n", len(r.Checks)-failed, failed)
}

// table writes rows as a markdown table, the columns in right
// right-aligned.
func table(w io.Writer, rows [][]string, right ...int) {
	widths := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	for ri, r := range rows {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range r {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if slices.Contains(right, i) {
				fmt.Fprintf(&b, " %s%s |", pad, c)
			} else {
				fmt.Fprintf(&b, " %s%s |", c, pad)
			}
		}
		fmt.Fprintln(w, b.String())
		if ri == 0 {
			b.Reset()
			b.WriteString("|")
			for i := range r {
				if slices.Contains(right, i) {
					b.WriteString(strings.Repeat("-", widths[i]+1) + ":|")
				} else {
					b.WriteString(strings.Repeat("-", widths[i]+2) + "|")
				}
			}
			fmt.Fprintln(w, b.String())
		}
	}
	fmt.Fprintln(w)
}

func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "–"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(10 * time.Millisecond).String()
	}
}

// writeJSON writes the report to path.
func (r *report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func hashOf(b []byte) [32]byte { return sha256.Sum256(b) }
