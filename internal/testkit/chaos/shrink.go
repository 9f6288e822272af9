package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// savedCase is a shrunk failing schedule kept under testdata/chaos: the
// test replays it and expects every invariant to hold.
type savedCase struct {
	// Name names the file; Fault says what was wrong when the schedule
	// failed, and Broke the invariants that broke then.
	Name  string   `json:"name"`
	Fault string   `json:"fault"`
	Broke []string `json:"broke"`
	// Seed is the schedule's seed; Found how many actions it had before
	// shrinking.
	Seed  uint64 `json:"seed"`
	Found int    `json:"found"`
	// Cluster marks a schedule of cluster mode: it needs the topology of
	// scripts/cluster.sh, and the single-box replay skips it.
	Cluster bool `json:"cluster,omitempty"`
	// Actions are the shrunk schedule.
	Actions []Action `json:"actions"`
}

func (c savedCase) write(dir string) (string, error) {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	path := filepath.Join(dir, c.Name+".json")
	return path, os.WriteFile(path, append(b, '\n'), 0o644)
}

func readCase(path string) (savedCase, error) {
	var c savedCase
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("chaos: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("chaos: %s: %w", path, err)
	}
	return c, nil
}

// shrinker reduces a failing schedule by delta debugging (ddmin): it
// keeps the smallest sub-list of actions, in their order, whose run still
// breaks one of the invariants the original broke.
type shrinker struct {
	env    env
	seed   uint64
	broke  []string
	until  time.Time // the budget: the best so far is kept after it
	trials int
	logf   func(format string, args ...any)
}

// fails runs actions and reports whether one of the invariants broke again.
func (s *shrinker) fails(ctx context.Context, actions []Action) bool {
	s.trials++
	rep, err := runSchedule(ctx, s.env, s.seed, actions)
	if err != nil {
		s.logf("chaos: shrink trial %d (%d actions) did not run: %v", s.trials, len(actions), err)
		return false
	}
	for _, inv := range rep.failed() {
		if slices.Contains(s.broke, inv) {
			s.logf("chaos: shrink trial %d: %d actions still break %s", s.trials, len(actions), inv)
			return true
		}
	}
	s.logf("chaos: shrink trial %d: %d actions pass", s.trials, len(actions))
	return false
}

// reproduceTries is how many times the whole schedule runs again before
// shrinking: a failure none of them repeats depends on timing more than on
// the actions, and trials of its parts would all pass.
const reproduceTries = 3

// reproduces runs the whole schedule again, up to reproduceTries times,
// and reports whether it failed again.
func (s *shrinker) reproduces(ctx context.Context, c []Action) bool {
	for range reproduceTries {
		if ctx.Err() != nil || !time.Now().Before(s.until) {
			return false
		}
		if s.fails(ctx, c) {
			return true
		}
	}
	return false
}

// ddmin is Zeller's minimising delta debugging over the action list,
// each trial a run of the schedule.
func (s *shrinker) ddmin(ctx context.Context, c []Action) []Action {
	return s.minimise(ctx, c, func(c []Action) bool { return s.fails(ctx, c) })
}

// minimise shrinks c while fails holds, until no single chunk can go
// (1-minimal at the finest granularity) or the budget is spent.
func (s *shrinker) minimise(ctx context.Context, c []Action, fails func([]Action) bool) []Action {
	n := 2
	for len(c) >= 2 && time.Now().Before(s.until) && ctx.Err() == nil {
		chunks := split(c, n)
		reduced := false
		for _, chunk := range chunks { // a chunk alone
			if fails(chunk) {
				c, n, reduced = chunk, 2, true
				break
			}
		}
		if !reduced && n > 2 {
			for i := range chunks { // everything but a chunk
				rest := complement(chunks, i)
				if fails(rest) {
					c, n, reduced = rest, max(n-1, 2), true
					break
				}
			}
		}
		if !reduced {
			if n >= len(c) {
				break
			}
			n = min(2*n, len(c))
		}
	}
	return c
}

func split(c []Action, n int) [][]Action {
	var out [][]Action
	size, extra := len(c)/n, len(c)%n
	start := 0
	for i := 0; i < n; i++ {
		end := start + size
		if i < extra {
			end++
		}
		out = append(out, c[start:end])
		start = end
	}
	return out
}

func complement(chunks [][]Action, skip int) []Action {
	var out []Action
	for i, ch := range chunks {
		if i != skip {
			out = append(out, ch...)
		}
	}
	return out
}
