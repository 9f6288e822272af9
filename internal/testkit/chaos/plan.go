package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// cleanupFloor is the retention floor of a schedule: longer than any
// redelivery of a message the workers committed takes (a kill, a cut
// connection), so that a cleanup at or above it forgets only rows nothing
// brings back but a publisher sending a copy late.
const cleanupFloor = 4 * time.Second

// Kind is the kind of one action of a schedule.
type Kind string

// Action kinds. Publishes go to the main queue (an id in the JSON field
// "id"; two workers compete for it) or, for keyed ones, to the ordered queue
// (one worker, OrderingKey "key"). Faults and operator doors act on the
// processes, the fault proxies in front of PostgreSQL and RabbitMQ, and the
// tables.
const (
	KindPublishNew      Kind = "publish_new"       // a new message, id never used
	KindPublishSameID   Kind = "publish_same_id"   // an earlier message again, byte for byte
	KindPublishSameBody Kind = "publish_same_body" // an earlier message's body content under a new id
	KindPublishConflict Kind = "publish_conflict"  // an earlier id with another payload
	KindPublishSpelling Kind = "publish_spelling"  // an earlier numeric id spelt another way (1000, 1000.0, 1e3)
	KindPublishCharge   Kind = "publish_charge"    // a new message whose handler records a gateway charge
	KindPublishKeyed    Kind = "publish_keyed"     // the next message of a key whose order must hold
	KindMalformed       Kind = "publish_malformed" // a body that is not JSON
	KindNoID            Kind = "publish_no_id"     // a JSON body without an id
	KindOversized       Kind = "publish_oversized" // a body larger than the workers' MaxMessageBytes
	KindHTTPNew         Kind = "http_new"          // a request with a new Idempotency-Key
	KindHTTPRetry       Kind = "http_retry"        // an earlier request again, same key and body
	KindHTTPRace        Kind = "http_race"         // two requests with one new key at once
	KindHTTPConflict    Kind = "http_conflict"     // an earlier key with another body
	KindKill            Kind = "kill"              // kill -9 of a worker process, started again
	KindConnCut         Kind = "conn_cut"          // every broker connection severed
	KindPGRefuse        Kind = "pg_refuse"         // PostgreSQL refuses connections until pg_heal
	KindPGBlackhole     Kind = "pg_blackhole"      // PostgreSQL stops answering until pg_heal
	KindPGHeal          Kind = "pg_heal"           // the PostgreSQL outage ends
	KindCleanup         Kind = "cleanup"           // the cutoff's time passes, then retention cleans inbox, dead letters and settled effects older than it (≥ the floor)
	KindRedrive         Kind = "redrive"           // dead letters redriven, by id, by reason or all
	KindResolve         Kind = "resolve"           // an operator resolves the unknown effects after asking the gateway
	KindWait            Kind = "wait"              // time passes
	// Streams, replays and rebuilds: a third consumer reads a stream
	// (worker 0), its handler keeps the projection chaos_proj.
	KindPublishStream  Kind = "publish_stream"      // a new message on the stream, some with a charge
	KindReplay         Kind = "replay"              // a replay of the stream from an offset, in mode normal, forensic or repair
	KindRebuild        Kind = "rebuild"             // an online rebuild of chaos_proj: finished, killed and resumed, or killed and abandoned
	KindUndecodable    Kind = "publish_undecodable" // a message whose header table is nested 40 deep: the client library cannot decode it
	KindKillDispatcher Kind = "kill_dispatcher"     // kill -9 of the dispatcher process alone, started again
	KindHTTPExpired    Kind = "http_expired"        // an earlier key again once its expiry has passed
	KindPublishPart    Kind = "publish_partitioned" // the next message of a key of the partitioned queue, shared by the workers and a joiner
	KindPartJoin       Kind = "partition_join"      // a third process joins the partitioned consumer
	KindPartLeave      Kind = "partition_leave"     // the joiner leaves: stopped, or killed -9 (fate stop or kill)
	KindKillEdge       Kind = "kill_edge"           // kill -9 of the HTTP edge process Millis after a request with a new key, started again; the client retries
	// Cluster mode only (-cluster, the topology of scripts/cluster.sh):
	// faults the single-box services cannot take.
	KindNodeKill  Kind = "node_kill"  // kill -9 of RabbitMQ node Node, started again by node_start (or at the end of the schedule)
	KindNodeStart Kind = "node_start" // the killed node started again; it waits until the node runs
	KindPGCrash   Kind = "pg_crash"   // the PostgreSQL primary stopped at once (pg_ctl -m immediate), held down Millis, then started again (fate restart: crash recovery) or the standby promoted and the old primary rejoined as its standby (fate failover)
)

// Replay modes of a replay action, and the fates of a rebuild.
const (
	ReplayNormal   = "normal"
	ReplayForensic = "forensic"
	ReplayRepair   = "repair"

	RebuildFinish  = "finish"       // runs to its swap
	RebuildResume  = "kill_resume"  // killed after Seq applications, then run again with its run id
	RebuildAbandon = "kill_abandon" // killed after Seq applications, then abandoned
)

// Fates of a pg_crash.
const (
	PGRestart  = "restart"  // the stopped primary is started again: crash recovery
	PGFailover = "failover" // the standby is promoted; the old primary rejoins as a fresh standby
)

var (
	replayModes  = []string{ReplayNormal, ReplayNormal, ReplayForensic, ReplayRepair} // normal twice: the horizon is its door
	rebuildFates = []string{RebuildFinish, RebuildResume, RebuildAbandon}
	pgFates      = []string{PGRestart, PGRestart, PGFailover}
)

// Gateway behaviours of a charge: what the fake payment gateway does with
// the first request under the charge's idempotency key. Later requests
// under the key are charged and answered 200, but for in-progress, whose
// first request already charged.
const (
	Behave2xx        = "2xx"          // charged, 200
	Behave5xxBefore  = "5xx_before"   // 503 with Retry-After, not charged
	Behave5xxAfter   = "5xx_after"    // charged, then 502
	BehaveInProgress = "409_progress" // charged, answered 409 IDEMPOTENCY_REQUEST_IN_PROGRESS
	BehaveDropAfter  = "drop_after"   // charged, connection closed without an answer
	BehaveSlow       = "slow"         // charged after 1.5s, 200
	BehaveTimeout    = "slow_timeout" // charged, answered 200 after the dispatcher's 3s timeout
)

var behaviours = []string{Behave2xx, Behave5xxBefore, Behave5xxAfter, BehaveInProgress, BehaveDropAfter, BehaveSlow, BehaveTimeout}

// Action is one step of a schedule. Its fields are what the runner needs to
// do it again the same way: no field depends on timing.
type Action struct {
	Kind Kind `json:"kind"`
	// ID is the message id (publishes); Ref the id of the earlier message
	// a copy, a conflict or a spelling refers to.
	ID  string `json:"id,omitempty"`
	Ref string `json:"ref,omitempty"`
	// Spelling is how a numeric id is written in the body.
	Spelling string `json:"spelling,omitempty"`
	// Amount is the deposit's amount: a conflict has another one.
	Amount int64 `json:"amount,omitempty"`
	// Behave is the gateway's behaviour for a charge.
	Behave string `json:"behave,omitempty"`
	// Key and Seq place a keyed message; Fail makes its first attempt fail.
	Key  string `json:"key,omitempty"`
	Seq  int    `json:"seq,omitempty"`
	Fail bool   `json:"fail,omitempty"`
	// Worker is the process a kill hits; Node the RabbitMQ node (1 to
	// clusterNodes) a node_kill or node_start acts on.
	Worker int `json:"worker,omitempty"`
	Node   int `json:"node,omitempty"`
	// By is how a redrive selects: "id", "reason" or "all"; Arg its id or reason.
	By  string `json:"by,omitempty"`
	Arg string `json:"arg,omitempty"`
	// Millis is how long a wait lasts, or a cleanup's cutoff: rows older
	// than this go.
	Millis int `json:"millis,omitempty"`
	// Mode is a replay's mode; Fate a rebuild's (see the Rebuild
	// constants; Seq is then how many applications it dies after), or how
	// the joiner leaves (stop or kill).
	Mode string `json:"mode,omitempty"`
	Fate string `json:"fate,omitempty"`
	// Offset is where a replay starts: the Offset-th message published to
	// the stream (the last one when fewer were).
	Offset int `json:"offset,omitempty"`
}

// String is the action on one line, as -plan prints it.
func (a Action) String() string {
	var b strings.Builder
	b.WriteString(string(a.Kind))
	add := func(k string, v any) { fmt.Fprintf(&b, " %s=%v", k, v) }
	if a.ID != "" {
		add("id", a.ID)
	}
	if a.Ref != "" {
		add("ref", a.Ref)
	}
	if a.Spelling != "" {
		add("spelling", a.Spelling)
	}
	if a.Amount != 0 {
		add("amount", a.Amount)
	}
	if a.Behave != "" {
		add("gateway", a.Behave)
	}
	if a.Key != "" {
		add("key", a.Key)
		add("seq", a.Seq)
	}
	if a.Mode != "" {
		add("mode", a.Mode)
	}
	if a.Kind == KindReplay {
		add("from", a.Offset)
	}
	if a.Fate != "" {
		add("fate", a.Fate)
		if a.Kind == KindRebuild {
			add("after", a.Seq)
		}
	}
	if a.Fail {
		add("fail_first", true)
	}
	if a.Kind == KindKill {
		add("worker", a.Worker)
	}
	if a.Node != 0 {
		add("node", a.Node)
	}
	if a.By != "" {
		add("by", a.By)
	}
	if a.Arg != "" {
		add("arg", a.Arg)
	}
	if a.Millis != 0 {
		add("ms", a.Millis)
	}
	return b.String()
}

// weights are the odds of each kind the generator draws (outages are
// opened here and healed a few actions later).
var weights = []struct {
	kind Kind
	w    int
}{
	{KindPublishNew, 12}, {KindPublishSameID, 6}, {KindPublishSameBody, 3}, {KindPublishConflict, 4},
	{KindPublishSpelling, 5}, {KindPublishCharge, 8}, {KindPublishKeyed, 10}, {KindMalformed, 2},
	{KindNoID, 1}, {KindOversized, 1}, {KindHTTPNew, 3}, {KindHTTPRetry, 2}, {KindHTTPRace, 2}, {KindHTTPConflict, 1}, {KindKill, 3}, {KindConnCut, 2}, {KindPGRefuse, 1},
	{KindPGBlackhole, 1}, {KindCleanup, 2}, {KindRedrive, 2}, {KindResolve, 1}, {KindWait, 6},
	{KindPublishStream, 8}, {KindReplay, 7}, {KindRebuild, 4}, {KindUndecodable, 2}, {KindKillDispatcher, 2},
	{KindHTTPExpired, 3}, {KindKillEdge, 2}, {KindPublishPart, 8}, {KindPartJoin, 2}, {KindPartLeave, 4},
}

// clusterWeights are the odds of every kind in cluster mode: the
// single-box kinds, and the faults of the cluster's topology.
var clusterWeights = append(slices.Clone(weights), []struct {
	kind Kind
	w    int
}{{KindNodeKill, 4}, {KindPGCrash, 3}}...)

// clusterNodes is how many RabbitMQ nodes scripts/cluster.sh runs.
const clusterNodes = 3

// workers is how many worker processes a schedule runs: each consumes the
// main queue; worker 0 also the ordered one.
const workers = 2

// keys are the ordering keys of keyed messages; partKeys those of the
// partitioned queue.
var (
	keys     = []string{"k1", "k2", "k3"}
	partKeys = []string{"a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a10", "a11", "a12"}
)

// The processes after the workers: the ledger dispatcher, the HTTP edge,
// and the process that joins and leaves the partitioned consumer.
const (
	dispatcherProc = workers
	edgeProc       = workers + 1
	joinerProc     = workers + 2
)

// generate returns the single-box schedule of seed: n actions, the same
// for the same seed on every machine.
func generate(seed uint64, n int) []Action { return generateFor(seed, n, false) }

// generateFor returns the schedule of seed, in cluster mode when cluster
// is true: the single-box kinds and the cluster's faults, with at least one
// node_kill and one pg_crash (appended when the draw had none).
func generateFor(seed uint64, n int, cluster bool) []Action {
	r := rand.New(rand.NewPCG(seed, 0x63686173))
	g := &gen{r: r, seq: map[string]int{}}
	table := weights
	if cluster {
		table = clusterWeights
	}
	out := make([]Action, 0, n+1)
	for len(out) < n {
		if a, ok := g.close(); ok {
			out = append(out, a)
			continue
		}
		if a, ok := g.next(pick(r, table)); ok {
			out = append(out, a)
		}
	}
	if g.outage > 0 {
		out = append(out, Action{Kind: KindPGHeal})
	}
	if g.downFor > 0 {
		out = append(out, Action{Kind: KindNodeStart, Node: g.down})
	}
	if cluster {
		out = ensureClusterFaults(r, out)
	}
	return out
}

// close counts down the open outage and the node down, and returns the
// action that ends one when its time came.
func (g *gen) close() (Action, bool) {
	if g.outage > 0 {
		g.outage--
		if g.outage == 0 {
			return Action{Kind: KindPGHeal}, true
		}
	}
	if g.downFor > 0 {
		g.downFor--
		if g.downFor == 0 {
			return Action{Kind: KindNodeStart, Node: g.down}, true
		}
	}
	return Action{}, false
}

// ensureClusterFaults appends a node kill (with its start after a wait)
// and a PostgreSQL crash to a cluster schedule that drew none.
func ensureClusterFaults(r *rand.Rand, out []Action) []Action {
	has := func(k Kind) bool { return slices.ContainsFunc(out, func(a Action) bool { return a.Kind == k }) }
	if !has(KindNodeKill) {
		node := 1 + r.IntN(clusterNodes)
		out = append(out, Action{Kind: KindNodeKill, Node: node}, Action{Kind: KindWait, Millis: 100 * (1 + r.IntN(15))},
			Action{Kind: KindNodeStart, Node: node})
	}
	if !has(KindPGCrash) {
		out = append(out, Action{Kind: KindPGCrash, Fate: pgFates[r.IntN(len(pgFates))], Millis: 500 * r.IntN(7)})
	}
	return out
}

func pick(r *rand.Rand, table []struct {
	kind Kind
	w    int
}) Kind {
	total := 0
	for _, w := range table {
		total += w.w
	}
	x := r.IntN(total)
	for _, w := range table {
		if x < w.w {
			return w.kind
		}
		x -= w.w
	}
	return KindWait
}

// gen is the generator's state: what was published, so that copies refer
// to earlier messages.
type gen struct {
	r       *rand.Rand
	n       int      // ids handed out
	ids     []string // ids published, string and numeric
	keys    []string // Idempotency-Keys sent
	numeric []string // numeric ids published
	stream  []string // ids published to the stream
	seq     map[string]int
	outage  int  // actions until the open PostgreSQL outage heals; 0: none
	joined  bool // the joiner runs
	downFor int  // actions until the killed RabbitMQ node starts again; 0: none
	down    int  // the node killed
}

func (g *gen) newID() (id, spelling string) {
	g.n++
	if g.r.IntN(3) == 0 {
		id = fmt.Sprintf("%d", 1000*g.n)
		g.numeric = append(g.numeric, id)
		return id, id
	}
	return fmt.Sprintf("m%d", g.n), ""
}

// next turns kind into an action, or reports false when kind cannot be
// drawn now (a copy before any original, a second outage).
func (g *gen) next(kind Kind) (Action, bool) {
	if a, ok, done := g.nextPublish(kind); done {
		return a, ok
	}
	r := g.r
	a := Action{Kind: kind}
	switch kind {
	case KindPublishPart:
		a.Key = partKeys[r.IntN(len(partKeys))]
		g.seq[a.Key]++
		a.Seq = g.seq[a.Key]
		a.Fail = r.IntN(4) == 0
	case KindPartJoin:
		if g.joined {
			return a, false
		}
		g.joined = true
	case KindPartLeave:
		if !g.joined {
			return a, false
		}
		g.joined = false
		a.Fate = []string{"stop", "kill"}[r.IntN(2)]
	case KindHTTPNew, KindHTTPRace, KindKillEdge:
		if kind == KindKillEdge {
			a.Millis = 20 * r.IntN(15)
		}
		g.n++
		a.ID, a.Amount = fmt.Sprintf("h%d", g.n), 1+r.Int64N(99)
		g.keys = append(g.keys, a.ID)
	case KindHTTPRetry, KindHTTPConflict:
		if len(g.keys) == 0 {
			return a, false
		}
		a.Ref = g.keys[r.IntN(len(g.keys))]
		if kind == KindHTTPConflict {
			a.Amount = 100 + r.Int64N(100)
		}
	case KindPublishStream:
		g.n++
		a.ID, a.Amount = fmt.Sprintf("s%d", g.n), 1+r.Int64N(99)
		if r.IntN(2) == 0 {
			a.Behave = behaviours[r.IntN(len(behaviours))]
		}
		g.stream = append(g.stream, a.ID)
	case KindReplay:
		if len(g.stream) == 0 {
			return a, false
		}
		a.Mode = replayModes[r.IntN(len(replayModes))]
		a.Offset = r.IntN(len(g.stream))
		if r.IntN(3) == 0 {
			a.Offset = 0 // from the first: below the horizon once a cleanup forgot some
		}
		if a.Mode == ReplayRepair {
			a.Ref = g.stream[r.IntN(len(g.stream))]
		}
	case KindRebuild:
		if len(g.stream) == 0 {
			return a, false
		}
		a.Fate = rebuildFates[r.IntN(len(rebuildFates))]
		a.Seq = 1 + r.IntN(min(len(g.stream), 2))
	case KindUndecodable:
		g.n++
		a.ID = fmt.Sprintf("u%d", g.n)
	case KindHTTPExpired:
		if len(g.keys) == 0 {
			return a, false
		}
		a.Ref = g.keys[r.IntN(len(g.keys))]
	case KindKill:
		a.Worker = r.IntN(workers)
	case KindPGRefuse, KindPGBlackhole:
		if g.outage > 0 {
			return a, false
		}
		g.outage = 1 + r.IntN(4)
	case KindNodeKill, KindPGCrash:
		return g.nextCluster(kind)
	case KindRedrive:
		switch r.IntN(3) {
		case 0:
			if len(g.ids) == 0 {
				return a, false
			}
			a.By, a.Arg = "id", g.ids[r.IntN(len(g.ids))]
		case 1:
			a.By, a.Arg = "reason", []string{"payload_conflict", "decode_error", "message_too_large", "undecodable"}[r.IntN(4)]
		default:
			a.By = "all"
		}
	case KindCleanup:
		a.Millis = int(cleanupFloor/time.Millisecond) + 500*r.IntN(7)
	case KindWait:
		a.Millis = 100 * (1 + r.IntN(15))
	}
	return a, true
}

// nextCluster is next for the faults of cluster mode.
func (g *gen) nextCluster(kind Kind) (Action, bool) {
	r := g.r
	a := Action{Kind: kind}
	if kind == KindNodeKill {
		if g.downFor > 0 {
			return a, false // one node down at most: a majority keeps serving
		}
		a.Node = 1 + r.IntN(clusterNodes)
		g.down, g.downFor = a.Node, 1+r.IntN(4)
		return a, true
	}
	if g.outage > 0 {
		return a, false // the proxies' outage would hide the crash from readiness
	}
	a.Fate = pgFates[r.IntN(len(pgFates))]
	a.Millis = 500 * r.IntN(7)
	return a, true
}

// nextPublish is next for the publishes to the main and the ordered
// queues; done is false for another kind.
func (g *gen) nextPublish(kind Kind) (a Action, ok, done bool) {
	r := g.r
	a = Action{Kind: kind}
	switch kind {
	case KindPublishNew, KindPublishSameBody, KindPublishCharge:
		if kind == KindPublishSameBody {
			if len(g.ids) == 0 {
				return a, false, true
			}
			a.Ref = g.ids[r.IntN(len(g.ids))]
		}
		a.ID, a.Spelling = g.newID()
		a.Amount = 1 + r.Int64N(99)
		if kind == KindPublishCharge {
			a.Behave = behaviours[r.IntN(len(behaviours))]
		}
		g.ids = append(g.ids, a.ID)
	case KindPublishSameID, KindPublishConflict:
		if len(g.ids) == 0 {
			return a, false, true
		}
		a.Ref = g.ids[r.IntN(len(g.ids))]
		if kind == KindPublishConflict {
			a.Amount = 100 + r.Int64N(100)
		}
	case KindPublishSpelling:
		if len(g.numeric) == 0 {
			return a, false, true
		}
		a.Ref = g.numeric[r.IntN(len(g.numeric))]
		a.Spelling = spellings(a.Ref)[r.IntN(3)]
	case KindPublishKeyed:
		a.Key = keys[r.IntN(len(keys))]
		g.seq[a.Key]++
		a.Seq = g.seq[a.Key]
		a.Fail = r.IntN(4) == 0
	default:
		return a, false, false
	}
	return a, true, true
}

// spellings are three spellings of the numeric id id (a multiple of 1000):
// its canonical one, with a fraction, and with an exponent.
func spellings(id string) [3]string {
	return [3]string{id, id + ".0", strings.TrimSuffix(id, "000") + "e3"}
}
