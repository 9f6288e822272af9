package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// maxFailures is how many failures per invariant a report keeps.
const maxFailures = 5

// report is what one schedule did and what held.
type report struct {
	Seed     uint64                     `json:"seed"`
	Actions  map[Kind]int               `json:"actions"`
	Doors    map[string]int             `json:"doors,omitempty"`
	Checks   map[string]*invariantCount `json:"checks"`
	Failures []string                   `json:"failures,omitempty"`
}

type invariantCount struct {
	Checked int `json:"checked"`
	Failed  int `json:"failed"`
}

func newReport(seed uint64, actions []Action) *report {
	rep := &report{Seed: seed, Actions: map[Kind]int{}, Checks: map[string]*invariantCount{}}
	for _, a := range actions {
		rep.Actions[a.Kind]++
	}
	return rep
}

// expect counts one check of invariant inv; when ok is false it records
// the failure, formatted (an empty format records nothing more).
func (rep *report) expect(inv string, ok bool, format string, args ...any) {
	c := rep.Checks[inv]
	if c == nil {
		c = &invariantCount{}
		rep.Checks[inv] = c
	}
	c.Checked++
	if ok {
		return
	}
	c.Failed++
	if c.Failed <= maxFailures && format != "" {
		rep.Failures = append(rep.Failures, inv+": "+fmt.Sprintf(format, args...))
	}
}

// failed lists the invariants that failed.
func (rep *report) failed() []string {
	var out []string
	for _, inv := range sortedKeys(rep.Checks) {
		if rep.Checks[inv].Failed > 0 {
			out = append(out, inv)
		}
	}
	return out
}

// pass is true when no check failed and something was exercised: a
// schedule that published nothing, or checked nothing, does not pass.
func (rep *report) pass() bool {
	checks := 0
	for _, c := range rep.Checks {
		checks += c.Checked
	}
	return len(rep.failed()) == 0 && len(rep.Actions) > 0 && checks > 0
}

// total adds reports up: the run's report over its schedules.
type total struct {
	Seed      uint64
	Schedules int
	Actions   map[Kind]int
	Doors     map[string]int
	Checks    map[string]*invariantCount
	Failed    []*report
	// All says every invariant must have been checked: a run of many
	// schedules; a single replayed case need not touch them all.
	All bool
	// Cluster says the run was in cluster mode: with All, it must also
	// have killed a RabbitMQ node and crashed the PostgreSQL primary.
	Cluster bool
}

func (t *total) add(rep *report) {
	if t.Actions == nil {
		t.Actions, t.Checks, t.Doors = map[Kind]int{}, map[string]*invariantCount{}, map[string]int{}
	}
	for k, n := range rep.Doors {
		t.Doors[k] += n
	}
	t.Schedules++
	for k, n := range rep.Actions {
		t.Actions[k] += n
	}
	for inv, c := range rep.Checks {
		if t.Checks[inv] == nil {
			t.Checks[inv] = &invariantCount{}
		}
		t.Checks[inv].Checked += c.Checked
		t.Checks[inv].Failed += c.Failed
	}
	if !rep.pass() {
		t.Failed = append(t.Failed, rep)
	}
}

// pass is true when every schedule passed and the run exercised every
// invariant the oracle knows.
func (t *total) pass() bool {
	return t.Schedules > 0 && len(t.Failed) == 0 && (!t.All || len(t.missing()) == 0)
}

// missing are the invariants no schedule checked.
func (t *total) missing() []string {
	var out []string
	for _, inv := range []string{invExactlyOnce, invConflictLoud, invEffectOnce, invMaybeHappened, invEffectBound,
		invKeyOrder, invNothingLost, invDeadLetters, invDrain, invReadiness, invWorkersUp, invHTTPOnce,
		invStreamOnce, invProjection, invForensic, invHorizon, invReplayRuns, invRebuild, invAbandon, invUndecodable, invExpired, invEdgeKill, invPartOrder} {
		if c := t.Checks[inv]; c == nil || c.Checked == 0 {
			out = append(out, inv)
		}
	}
	if t.Cluster {
		if t.Doors[doorNodeKilled] == 0 {
			out = append(out, "a RabbitMQ node killed")
		}
		if t.Doors[doorPGRestarted]+t.Doors[doorPGFailedOver] == 0 {
			out = append(out, "a PostgreSQL crash")
		}
	}
	return out
}

func (t *total) print(w io.Writer) {
	fmt.Fprintf(w, "chaos: seed %d, %d schedules\n\nactions by kind:\n", t.Seed, t.Schedules)
	kinds := slices.SortedFunc(maps.Keys(t.Actions), func(a, b Kind) int { return cmp.Compare(a, b) })
	for _, k := range kinds {
		fmt.Fprintf(w, "  %-20s %6d\n", k, t.Actions[k])
	}
	if len(t.Doors) > 0 {
		fmt.Fprintln(w, "\nreplays, rebuilds and other doors, by outcome:")
		for _, k := range sortedKeys(t.Doors) {
			fmt.Fprintf(w, "  %-36s %6d\n", k, t.Doors[k])
		}
	}
	fmt.Fprintln(w, "\nchecks by invariant:")
	for _, inv := range sortedKeys(t.Checks) {
		c := t.Checks[inv]
		fmt.Fprintf(w, "  %-22s %6d checked %4d failed\n", inv, c.Checked, c.Failed)
	}
	if m := t.missing(); len(m) > 0 && t.All {
		fmt.Fprintf(w, "\nnever checked: %s\n", strings.Join(m, ", "))
	}
	for _, rep := range t.Failed {
		fmt.Fprintf(w, "\nFAIL schedule seed %d: %s\n", rep.Seed, strings.Join(rep.failed(), ", "))
		for _, f := range rep.Failures {
			fmt.Fprintf(w, "  %s\n", f)
		}
	}
	verdict := "PASS"
	if !t.pass() {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "\n%s (seed %d)\n", verdict, t.Seed)
}

func sortedKeys[M ~map[K]V, K cmp.Ordered, V any](m M) []K {
	return slices.Sorted(maps.Keys(m))
}
