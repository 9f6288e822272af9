package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
)

// workerEnv marks the test binary started as a chaos worker.
const workerEnv = "IDEM_CHAOS_WORKER"

// TestMain lets the test binary be the workers' binary too: started with
// workerEnv set, it runs `chaos worker` instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// testEnv runs the workers as this test binary. Without the services the
// test is skipped, or fails under CI=true.
func testEnv(t *testing.T) env {
	t.Helper()
	testdb.Pool(t)         // skips, or fails under CI, without PostgreSQL
	_ = testbroker.Dial(t) // likewise without RabbitMQ
	exe, err := os.Executable()
	require.NoError(t, err)
	return env{pgURL: testdb.URL(), amqpURL: testbroker.URL(), logOut: os.Stderr,
		worker: func(args []string) *exec.Cmd {
			cmd := exec.Command(exe, args...)
			cmd.Env = append(os.Environ(), workerEnv+"=1")
			return cmd
		}}
}

// TestSavedSchedulesHold replays every shrunk schedule under
// testdata/chaos: each once broke an invariant, and each must hold now.
// Cluster cases (testdata/chaos/cluster, or marked cluster) need the
// topology of scripts/cluster.sh: make chaos-cluster CHAOS_CASE=FILE
// replays one.
func TestSavedSchedulesHold(t *testing.T) {
	paths, err := filepath.Glob("../../../testdata/chaos/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, paths, "testdata/chaos holds no saved schedule")
	e := testEnv(t)
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			c, err := readCase(path)
			require.NoError(t, err)
			require.NotEmpty(t, c.Actions)
			if c.Cluster {
				t.Skipf("%s is a cluster case: make chaos-cluster CHAOS_CASE=%s replays it", c.Name, path)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			rep, err := runSchedule(ctx, e, c.Seed, c.Actions)
			require.NoError(t, err)
			for _, inv := range c.Broke {
				require.NotZero(t, rep.Checks[inv], "the schedule no longer checks %s, which it broke (%s)", inv, c.Fault)
			}
			require.True(t, rep.pass(), "%s broke %v: %v", c.Name, rep.failed(), rep.Failures)
		})
	}
}

// TestTheSameSeedPlansTheSameSchedule: -plan is a pure function of the
// seed, and another seed plans another schedule.
func TestTheSameSeedPlansTheSameSchedule(t *testing.T) {
	t.Parallel()
	plan := func(seed string) string {
		var out, errs bytes.Buffer
		require.Equal(t, exitPass, run(context.Background(), []string{"-seed", seed, "-plan"}, &out, &errs), errs.String())
		return out.String()
	}
	a := plan("42")
	require.Equal(t, a, plan("42"))
	require.NotEqual(t, a, plan("43"))
	require.Len(t, bytes.Split(bytes.TrimSpace([]byte(a)), []byte("\n")), len(generate(42, 30)))
}

// TestTheGeneratorDrawsEveryKind: over a few seeds every action kind
// comes up, and copies only refer to messages published before them.
func TestTheGeneratorDrawsEveryKind(t *testing.T) {
	t.Parallel()
	seen := map[Kind]bool{}
	for seed := uint64(1); seed <= 20; seed++ {
		published := map[string]bool{}
		for _, a := range generate(seed, 30) {
			seen[a.Kind] = true
			if a.Ref != "" && a.Kind != KindPublishSameBody {
				require.True(t, published[a.Ref], "seed %d: %s refers to a message not published before", seed, a)
			}
			if a.ID != "" {
				published[a.ID] = true
			}
		}
	}
	for _, w := range weights {
		require.True(t, seen[w.kind], "kind %s never drawn", w.kind)
	}
	require.True(t, seen[KindPGHeal])
}

// TestTheClusterFaultsAreDrawnInClusterModeOnly: the single-box
// generator never draws a node kill or a PostgreSQL crash; the cluster
// one has both in every schedule, kills one node at a time, starts each
// killed node again, and plans without the topology.
func TestTheClusterFaultsAreDrawnInClusterModeOnly(t *testing.T) {
	t.Parallel()
	cluster := []Kind{KindNodeKill, KindNodeStart, KindPGCrash}
	fates := map[string]bool{}
	for seed := uint64(1); seed <= 30; seed++ {
		for _, a := range generate(seed, 30) {
			require.NotContains(t, cluster, a.Kind, "seed %d: single-box schedule draws %s", seed, a)
		}
		down, kinds := 0, map[Kind]int{}
		for _, a := range generateFor(seed, 30, true) {
			kinds[a.Kind]++
			switch a.Kind {
			case KindNodeKill:
				require.Zero(t, down, "seed %d: node %d killed while node %d is down", seed, a.Node, down)
				require.True(t, a.Node >= 1 && a.Node <= clusterNodes, "seed %d: %s", seed, a)
				down = a.Node
			case KindNodeStart:
				require.Equal(t, down, a.Node, "seed %d: %s starts a node not down", seed, a)
				down = 0
			case KindPGCrash:
				fates[a.Fate] = true
			}
		}
		require.Zero(t, down, "seed %d: a killed node is never started again", seed)
		require.NotZero(t, kinds[KindNodeKill], "seed %d: no node kill", seed)
		require.NotZero(t, kinds[KindPGCrash], "seed %d: no PostgreSQL crash", seed)
	}
	require.Equal(t, map[string]bool{PGRestart: true, PGFailover: true}, fates)
	var out, errs bytes.Buffer
	require.Equal(t, exitPass, run(context.Background(), []string{"-cluster", "-seed", "42", "-plan"}, &out, &errs), errs.String())
	require.Contains(t, out.String(), "node_kill")
}

// TestClusterModeSavesWhereTheSingleBoxReplayDoesNotRead: a failing
// cluster schedule goes to testdata/chaos/cluster (the replay of make
// test globs testdata/chaos/*.json), and a cluster run may go on after its
// duration while an invariant is unchecked; the single box keeps its
// defaults.
func TestClusterModeSavesWhereTheSingleBoxReplayDoesNotRead(t *testing.T) {
	t.Parallel()
	var errs bytes.Buffer
	single, err := parseFlags([]string{"-duration", "4m"}, &errs)
	require.NoError(t, err)
	require.Equal(t, "testdata/chaos", single.save)
	require.Zero(t, single.coverExtra)
	cluster, err := parseFlags([]string{"-cluster", "-duration", "4m"}, &errs)
	require.NoError(t, err)
	require.Equal(t, clusterSaveDir, cluster.save)
	require.Equal(t, filepath.Join("testdata", "chaos"), filepath.Dir(cluster.save))
	require.Equal(t, 4*time.Minute, cluster.coverExtra)
	dir := t.TempDir()
	path, err := savedCase{Name: "c", Cluster: true, Actions: []Action{{Kind: KindNodeKill, Node: 2}}}.write(dir)
	require.NoError(t, err)
	var out bytes.Buffer
	require.Equal(t, exitNotRun, replayCase(context.Background(), env{}, path, &out, &errs), "a cluster case replayed without the cluster")
}

// TestDeltaDebuggingFindsTheMinimalFailingPair: ddmin over a predicate
// that fails when two given actions are both present keeps exactly them.
func TestDeltaDebuggingFindsTheMinimalFailingPair(t *testing.T) {
	t.Parallel()
	var actions []Action
	for i := range 30 {
		actions = append(actions, Action{Kind: KindWait, Millis: i + 1})
	}
	x, y := actions[4], actions[21]
	s := &shrinker{until: time.Now().Add(time.Minute), logf: t.Logf}
	fails := func(c []Action) bool { return slices.Contains(c, x) && slices.Contains(c, y) }
	got := s.minimise(context.Background(), actions, fails)
	require.Equal(t, []Action{x, y}, got)
}
