package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clusterEnv is what scripts/cluster.sh env prints with its default ports.
const clusterEnv = `export IDEM_CLUSTER_NODES='idem1@localhost,idem2@localhost,idem3@localhost'
export IDEM_CLUSTER_AMQP_URLS='amqp://guest:guest@127.0.0.1:5681/,amqp://guest:guest@127.0.0.1:5682/,amqp://guest:guest@127.0.0.1:5683/'
export IDEM_CLUSTER_STREAM_URLS='rabbitmq-stream://guest:guest@127.0.0.1:5561/,rabbitmq-stream://guest:guest@127.0.0.1:5562/,rabbitmq-stream://guest:guest@127.0.0.1:5563/'
export IDEM_CLUSTER_PG_URL='postgres://root@127.0.0.1:5442,127.0.0.1:5443/test?sslmode=disable&target_session_attrs=read-write'
export IDEM_CLUSTER_PG_NODE_URLS='postgres://root@127.0.0.1:5442/test?sslmode=disable,postgres://root@127.0.0.1:5443/test?sslmode=disable'
`

// clusterArgs are the flags of make soak-cluster.
var clusterArgs = []string{"-n", "2000", "-rate", "60", "-fault-every", "4s", "-duration-cap", "3m",
	"-faults", "node,pgfailover,kill,connections", "-seed", "1"}

// onCluster is cfg pointed at the cluster of clusterEnv, its nodes in
// another order than the script lists them.
func onCluster(cfg config) config {
	cfg.amqpURLs = []string{"amqp://app:secret@127.0.0.1:5683/", "amqp://app:secret@127.0.0.1:5681/", "amqp://app:secret@127.0.0.1:5682/"}
	cfg.streamURL = "rabbitmq-stream://app:secret@127.0.0.1:5562/,rabbitmq-stream://app:secret@127.0.0.1:5561/,rabbitmq-stream://app:secret@127.0.0.1:5563/"
	cfg.pgURL = "postgres://root@127.0.0.1:5443,127.0.0.1:5442/test?target_session_attrs=read-write&sslmode=disable"
	return cfg
}

func TestClusterFaultsAreRefusedUnlessEveryURLNamesTheCluster(t *testing.T) {
	t.Parallel()
	vars := exports(clusterEnv)
	base := onCluster(testConfig(t, clusterArgs...))
	require.NoError(t, matchCluster(base, vars), "the cluster's URLs, in any order, with other credentials")

	single := base
	single.amqpURLs = []string{"amqp://guest:secret@127.0.0.1:5672/"}
	err := matchCluster(single, vars)
	require.ErrorContains(t, err, "IDEM_AMQP_URL (-amqp-url) names 127.0.0.1:5672, not its nodes 127.0.0.1:5681,127.0.0.1:5682,127.0.0.1:5683")
	require.ErrorContains(t, err, "-faults node and pgfailover")
	require.ErrorContains(t, err, "make soak-cluster")
	require.NotContains(t, err.Error(), "secret")

	two := base
	two.amqpURLs = base.amqpURLs[:2]
	require.ErrorContains(t, matchCluster(two, vars), "IDEM_AMQP_URL", "a list without every node")

	stream := base
	stream.streamURL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"
	require.ErrorContains(t, matchCluster(stream, vars), "IDEM_STREAM_URL names 127.0.0.1:5552")

	pg := base
	pg.pgURL = "postgres://root@127.0.0.1:5432/test?sslmode=disable"
	require.ErrorContains(t, matchCluster(pg, vars), "IDEM_PG_URL names 127.0.0.1:5432")

	pg.pgURL = "postgres://root@127.0.0.1:5442,127.0.0.1:5443/test?sslmode=disable"
	require.ErrorContains(t, matchCluster(pg, vars), "without target_session_attrs=read-write")

	require.Error(t, matchCluster(base, map[string]string{}), "no cluster described")
}

func TestFailoverNeedsASynchronousStandby(t *testing.T) {
	t.Parallel()
	require.ErrorContains(t, syncVerdict("on", "", false), "pg-mode sync", "PostgreSQL's default: asynchronous")
	require.ErrorContains(t, syncVerdict("remote_apply", "idem_pg2", false), "asynchronously", "the standby named is not streaming")
	require.ErrorContains(t, syncVerdict("local", "idem_pg2", true), "synchronous_commit is local")
	require.NoError(t, syncVerdict("remote_apply", "idem_pg2", true), "scripts/cluster.sh pg-mode sync")
	require.NoError(t, syncVerdict("on", "idem_pg2", true))
}

func TestNodeFaultHitsConnectedNodesInTurn(t *testing.T) {
	t.Parallel()
	require.Equal(t, 1, pickNode([]int{0, 3, 0}, []int{0, 0, 0}), "the node the workers are connected to")
	require.Equal(t, 2, pickNode([]int{0, 3, 1}, []int{0, 1, 0}), "of the connected nodes, the one killed least")
	require.Equal(t, 1, pickNode([]int{2, 5, 0}, []int{1, 1, 0}), "then the one with the most connections")
	require.Equal(t, 2, pickNode([]int{0, 0, 0}, []int{1, 1, 0}), "no connection found: the node killed least")

	c := &cluster{nodes: []string{"idem1@localhost", "idem2@localhost", "idem3@localhost"}, script: "cluster.sh"}
	c.down = "idem1@localhost"
	require.Equal(t, []string{"cluster.sh", "ctl", "idem2@localhost"}, c.ctl(), "rabbitmqctl on a node that is up")
	_, err := c.claimNode([]int{1, 1, 1})
	require.ErrorContains(t, err, "idem1@localhost is not running again yet", "one node down at a time")
	c.nodeUp()
	require.Equal(t, []string{"cluster.sh", "ctl", "idem1@localhost"}, c.ctl())

	require.NoError(t, c.claimFailover())
	require.Error(t, c.claimFailover(), "no failover before the last one's standby is back")
	c.rejoined()
	require.NoError(t, c.claimFailover())
}

func TestClusterReadsTheScriptsNodesAndPorts(t *testing.T) {
	t.Parallel()
	c := &cluster{}
	require.NoError(t, c.read(exports(clusterEnv)))
	require.Equal(t, []string{"idem1@localhost", "idem2@localhost", "idem3@localhost"}, c.nodes)
	require.Equal(t, []int{5681, 5682, 5683}, c.amqpPorts)
	require.Equal(t, 1, c.nodeOfPort(5682))
	require.Equal(t, 2, c.nodeOfPort(5563))
	require.Equal(t, -1, c.nodeOfPort(5672))
	require.Error(t, (&cluster{}).read(map[string]string{}))
}

func TestScheduleSpacesClusterFaultsAndFailsOverEarly(t *testing.T) {
	t.Parallel()
	for seed := range uint64(50) {
		cfg := testConfig(t, clusterArgs...)
		cfg.seed = seed + 1
		events, window, _, err := scheduled(cfg)
		require.NoError(t, err, "seed %d", cfg.seed)
		limit := min(window/2, cfg.durationCap-dispatcherLease-30*time.Second)
		last := map[string]time.Duration{}
		for _, e := range events {
			if t0, ok := last[e.fault]; ok {
				switch e.fault {
				case faultNode:
					require.GreaterOrEqual(t, e.at-t0, nodeEvery, "seed %d: a node killed at %s while the one killed at %s may be down", cfg.seed, e.at, t0)
				case faultPGFailover:
					require.GreaterOrEqual(t, e.at-t0, failoverEvery, "seed %d: failover at %s, standby of the one at %s not back", cfg.seed, e.at, t0)
				}
			}
			if e.fault == faultPGFailover {
				require.LessOrEqual(t, e.at, limit, "seed %d: failover at %s could strand a claim past the cap", cfg.seed, e.at)
			}
			last[e.fault] = e.at
		}
		for _, f := range []string{faultNode, faultPGFailover, faultKill, faultConnections} {
			require.Contains(t, last, f, "seed %d", cfg.seed)
		}
	}
}

func TestAMQPURLListIsReadAndPassedOn(t *testing.T) {
	t.Setenv("IDEM_STREAM_URL", "")
	list := "amqp://guest:guest@127.0.0.1:5681/,amqp://guest:guest@127.0.0.1:5682/, amqp://guest:guest@127.0.0.1:5683/"
	cfg := testConfig(t, "-amqp-url", list)
	require.Len(t, cfg.amqpURLs, 3)
	require.Equal(t, "rabbitmq-stream://guest:guest@127.0.0.1:5552/,rabbitmq-stream://guest:guest@127.0.0.1:5552/,rabbitmq-stream://guest:guest@127.0.0.1:5552/",
		cfg.streamURL, "without IDEM_STREAM_URL, derived node by node")
	require.NotContains(t, cfg.faults, faultNode, "the cluster faults only when asked for")
	require.NotContains(t, cfg.faults, faultPGFailover)

	h := &harness{cfg: cfg}
	env := h.env("postgres://root@127.0.0.1:5442,127.0.0.1:5443/test?application_name=w")
	require.Contains(t, env, "IDEM_AMQP_URL=amqp://guest:guest@127.0.0.1:5681/,amqp://guest:guest@127.0.0.1:5682/,amqp://guest:guest@127.0.0.1:5683/")
	require.Contains(t, env, "IDEM_STREAM_URL="+cfg.streamURL)
	require.Contains(t, env, "IDEM_PG_URL=postgres://root@127.0.0.1:5442,127.0.0.1:5443/test?application_name=w")

	ports, err := portSet(cfg.amqpURLs, 5672)
	require.NoError(t, err)
	require.Equal(t, map[int]bool{5681: true, 5682: true, 5683: true}, ports)

	var stderr bytes.Buffer
	_, err = parseFlags([]string{"-amqp-url", "amqp://app:secret@mq1/;amqp://app:secret@mq2/"}, &stderr)
	require.ErrorContains(t, err, "-amqp-url")
	require.NotContains(t, err.Error(), "secret")
}

func TestPGURLWithSeveralHostsTakesAnApplicationName(t *testing.T) {
	t.Parallel()
	u, err := withAppName("postgres://root@127.0.0.1:5442,127.0.0.1:5443/test?sslmode=disable&target_session_attrs=read-write", "soak_x_quickstart")
	require.NoError(t, err)
	hosts, rw, err := pgHosts(u)
	require.NoError(t, err)
	require.True(t, rw)
	require.Equal(t, []string{"127.0.0.1:5442", "127.0.0.1:5443"}, hosts)
	require.True(t, strings.Contains(u, "application_name=soak_x_quickstart"), u)
}

func TestPortFilterMatchesEveryNode(t *testing.T) {
	t.Parallel()
	f := portFilter("dport", map[int]bool{5563: true, 5561: true, 5562: true})
	require.Equal(t, "dport = :5561 or dport = :5562 or dport = :5563", f)
}
