package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/testkit/soak/soakworker"
)

// exitOf runs sh -c script as the next incarnation of p (its output in p's
// log) and returns what Wait returned.
func exitOf(t *testing.T, p *proc, script string) error {
	t.Helper()
	p.path, p.args = "/bin/sh", []string{"-c", script}
	require.NoError(t, p.spawn())
	return p.cmd.Wait()
}

func TestSupervisorTellsPoisonCrashesFromOtherExits(t *testing.T) {
	t.Parallel()
	p := &proc{name: "liveness", poison: true, logDir: t.TempDir()}
	marker := func(fault string) string {
		return "echo '" + soakworker.CrashMarker + " " + fault + " s1-crash-exit-1' >&2; "
	}

	require.True(t, p.exitedWith(exitOf(t, p, "echo working; "+marker(soakworker.FaultCrashExit)+"exit 3"), false),
		"a crash the worker announced, with its status, is asked for")
	require.True(t, p.exitedWith(exitOf(t, p, marker(soakworker.FaultCrashPanic)+"exit 2"), false))
	require.Len(t, p.crashes, 2)
	require.Equal(t, "s1-crash-exit-1", p.crashes[0])
	require.Empty(t, p.unexpected)

	require.False(t, p.exitedWith(exitOf(t, p, "exit 3"), false), "status 3 without the marker is a finding")
	require.False(t, p.exitedWith(exitOf(t, p, marker(soakworker.FaultCrashExit)+"exit 1"), false),
		"an exit status the fault does not produce is a finding")
	require.False(t, p.exitedWith(exitOf(t, p, "exit 0"), false), "a worker does not end by itself")
	require.Len(t, p.unexpected, 3)

	err := exitOf(t, p, marker(soakworker.FaultCrashExit)+"exit 3")
	p.stopping = true // the soak sent SIGTERM while the poison message ran
	require.True(t, p.exitedWith(err, false), "a poison crash while draining on SIGTERM is still a poison crash")
	require.Len(t, p.crashes, 3)
	require.Len(t, p.unexpected, 3)

	other := &proc{name: "quickstart", logDir: t.TempDir()}
	require.False(t, other.exitedWith(exitOf(t, other, marker(soakworker.FaultCrashExit)+"exit 3"), false),
		"only a process that may crash on purpose can")
	require.Empty(t, other.crashes)
}

func TestStoppedProcessMustEndCleanlyAndIsNotStartedAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	sup := &supervisor{ctx: ctx}
	defer sup.stop(cancel, 5*time.Second)
	worker := func(name string, status int) *proc {
		script := fmt.Sprintf("trap 'exit %d' TERM; echo ready; while :; do sleep 0.05; done", status)
		return &proc{name: name, path: "/bin/sh", args: []string{"-c", script}, restart: true, logDir: t.TempDir()}
	}
	clean, dirty := worker("clean", 0), worker("dirty", 1)
	for _, p := range []*proc{clean, dirty} {
		require.NoError(t, sup.start(p))
		deadline := time.Now().Add(30 * time.Second)
		for p.tail(1) != "ready" { // sh has installed its trap
			require.True(t, time.Now().Before(deadline), "%s never got ready", p.name)
			time.Sleep(10 * time.Millisecond)
		}
		p.stop(10 * time.Second)
		require.Zero(t, p.pid(), "%s runs again after stop", p.name)
		require.Equal(t, 1, p.incarnation)
	}
	require.Empty(t, clean.unexpected)
	require.Len(t, dirty.unexpected, 1)
	require.Contains(t, dirty.unexpected[0], "did not stop cleanly on SIGTERM")
}

func TestCrashCheckBoundsTheDeathsOfEachPoisonMessage(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, ciArgs...)
	p := &proc{crashes: []string{"a", "a", "a", "a", "b", "b", "b", "b", "b"}}
	h := &harness{cfg: cfg, sup: &supervisor{procs: []*proc{p}}}
	faulty := []deadLetter{
		{id: "a", reason: deadletters.ReasonWorkerCrashed},
		{id: "b", reason: deadletters.ReasonWorkerCrashed},
		{id: "c", reason: deadletters.ReasonWorkerCrashed},
		{id: "h", reason: deadletters.ReasonHandlerTimeout},
	}
	rep := &report{}
	h.checkCrashes(rep, faulty)
	require.Len(t, rep.Checks, 1)
	require.False(t, rep.Checks[0].OK)
	require.Contains(t, rep.Checks[0].Detail, "b: 5 worker deaths")
	require.Contains(t, rep.Checks[0].Detail, "c: 0 worker deaths")
	require.NotContains(t, rep.Checks[0].Detail, "a:")
	require.Equal(t, 9, rep.Crashes)

	p.crashes = p.crashes[:4]
	rep = &report{}
	h.checkCrashes(rep, faulty[:1])
	require.True(t, rep.Checks[0].OK, rep.Checks[0].Detail)
	require.Equal(t, "worker deaths per poison message: 4", rep.Checks[0].Detail)
}

func TestCompeteCheckFailsWhenAnExtraProcessAppliedNothing(t *testing.T) {
	t.Parallel()
	h := &harness{}
	rep := &report{Injections: []injection{{Fault: faultCompete, Processes: []string{"liveness-c1-1", "liveness-c1-2"}}},
		AppliedBy: map[string]int{"liveness": 500, "liveness-c1-1": 80}}
	h.checkCompete(rep)
	require.False(t, rep.Checks[0].OK)
	require.Contains(t, rep.Checks[0].Detail, "liveness-c1-2 applied nothing")

	rep.Checks, rep.AppliedBy["liveness-c1-2"] = nil, 3
	h.checkCompete(rep)
	require.True(t, rep.Checks[0].OK)
	require.Equal(t, "liveness-c1-1 80, liveness-c1-2 3; liveness 500", rep.Checks[0].Detail)
}

func TestReportShowsTheLivenessFaultsAndTheirOutcomes(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, ciArgs...)
	rep := &report{Run: "r", Config: reportConfig(cfg), Crashes: 4,
		Examples: []exampleReport{{Example: "liveness", Published: 12, Valid: 9, Faulty: 3}},
		Injections: []injection{
			{Fault: faultHang, Target: "liveness", At: time.Second, Recovery: 40 * time.Millisecond,
				Outcome: "dead-lettered as handler_timeout in 8.5s"},
			{Fault: faultCrash, Target: "liveness", At: 2 * time.Second, Recovery: 3 * time.Second,
				Outcome: "dead-lettered as worker_crashed after 4 worker deaths in 3s"},
			{Fault: faultCompete, Target: "liveness", At: 3 * time.Second, Unmeasured: true},
		},
		Checks: []checkResult{{Area: "liveness", What: "x", OK: true}}}
	rep.finish(cfg)
	require.True(t, rep.Pass)
	s := requirePrinted(t, rep,
		"| hung and poison (hang, crash faults) ",
		"recovered in 40ms; dead-lettered as handler_timeout in 8.5s",
		"worker_crashed after 4 worker deaths",
		"poison messages killed a liveness worker 4 times")
	for _, f := range []string{faultHang, faultCrash, faultCompete} {
		require.True(t, strings.Contains(s, "| "+f+" "), "no faults row for %s:\n%s", f, s)
	}
}
