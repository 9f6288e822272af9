package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pglock"
	"github.com/idemkit/idem/internal/testkit/testbroker"
	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/partitions"
)

// This file holds what the partition tests with worker processes observe:
// who holds which partition's lease (PostgreSQL), how many consumers each
// partition queue has (the broker), and which process applied each
// partition's events, and when (the applied events and the accounts'
// partitions).

// startOrderedWorker runs internal/testkit/testworker in ordered mode with label,
// its PostgreSQL sessions named schema/label (application_name), so that
// the test sees which process a backend, and the lease locks it holds,
// belong to; it is killed when the test ends.
func (e *env) startOrderedWorker(parts int, label string) *exec.Cmd {
	e.t.Helper()
	cmd := exec.Command(workerBinary(e.t), "-mode", "ordered", "-queue", e.queue, "-schema", e.tables.Schema,
		"-partitions", fmt.Sprint(parts), "-label", label)
	cmd.Env = append(os.Environ(), "IDEM_PG_URL="+withApplicationName(e.t, testdb.URL(), e.appName(label)))
	cmd.Stderr = os.Stderr
	require.NoError(e.t, cmd.Start(), "start worker %s", label)
	e.t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// appName is the application_name of the sessions of the worker label:
// unique to the test (its schema), and short of PostgreSQL's 63 bytes.
func (e *env) appName(label string) string { return e.tables.Schema + "/" + label }

// withApplicationName returns the PostgreSQL URL or keyword/value string
// pg with application_name set to name.
func withApplicationName(t *testing.T, pg, name string) string {
	t.Helper()
	if !strings.HasPrefix(pg, "postgres://") && !strings.HasPrefix(pg, "postgresql://") {
		return pg + " application_name='" + name + "'"
	}
	u, err := url.Parse(pg)
	require.NoError(t, err, "parse the PostgreSQL URL")
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// leaseState is the partition lease of a partitioned consumer as
// PostgreSQL holds it, by worker label: which processes hold the member
// lock, which holds each partition's lock, and how many sessions each
// process still has open (a killed process's sessions last until its
// backends notice).
type leaseState struct {
	parts    int
	members  []string       // sorted
	holder   map[int]string // partition → label
	backends map[string]int // label → sessions
}

// leaseOf reads the lease of the consumer testworker runs (Name "test") on
// e's queue, from pg_locks. The lock keys are partlease's (partlease.New,
// with consumer.New's Key): a change there shows as a lease nobody holds,
// which the test's first wait reports before it relies on the lease.
func (e *env) leaseOf(parts int) leaseState {
	e.t.Helper()
	key := e.tables.Schema + "/test/" + e.queue
	split := func(k int64) [2]int64 { return [2]int64{int64(uint64(k) >> 32), int64(uint64(k) & 0xffffffff)} }
	member := split(pglock.Key("partlease/" + key + "/members"))
	part := map[[2]int64]int{}
	for i := range parts {
		part[split(pglock.Key(fmt.Sprintf("partlease/%s/%d", key, i)))] = i
	}
	prefix := e.tables.Schema + "/"
	st := leaseState{parts: parts, holder: map[int]string{}, backends: map[string]int{}}
	ctx := context.Background()
	rows, err := e.pool.Query(ctx, `
		SELECT a.application_name, l.classid::bigint, l.objid::bigint
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND starts_with(a.application_name, $1)`, prefix)
	require.NoError(e.t, err, "read the lease locks")
	defer rows.Close()
	for rows.Next() {
		var app string
		var k [2]int64
		require.NoError(e.t, rows.Scan(&app, &k[0], &k[1]))
		label := strings.TrimPrefix(app, prefix)
		if k == member {
			st.members = append(st.members, label)
		} else if i, ok := part[k]; ok {
			st.holder[i] = label
		}
	}
	require.NoError(e.t, rows.Err(), "read the lease locks")
	slices.Sort(st.members)
	sessions, err := e.pool.Query(ctx, `SELECT application_name, count(*) FROM pg_stat_activity
		WHERE starts_with(application_name, $1) GROUP BY 1`, prefix)
	require.NoError(e.t, err, "read the workers' sessions")
	defer sessions.Close()
	for sessions.Next() {
		var app string
		var n int
		require.NoError(e.t, sessions.Scan(&app, &n))
		st.backends[strings.TrimPrefix(app, prefix)] = n
	}
	require.NoError(e.t, sessions.Err(), "read the workers' sessions")
	return st
}

// held returns the partitions label holds, ascending.
func (s leaseState) held(label string) []int {
	var out []int
	for i, l := range s.holder {
		if l == label {
			out = append(out, i)
		}
	}
	slices.Sort(out)
	return out
}

// spreadOver says why the lease is not spread over exactly labels, every
// partition held by one of them and none holding more than its share
// (ceil(N/members), partlease's rule), or "" when it is.
func (s leaseState) spreadOver(labels ...string) string {
	want := slices.Sorted(slices.Values(labels))
	if !slices.Equal(s.members, want) {
		return fmt.Sprintf("members %v, want %v", s.members, want)
	}
	share := (s.parts + len(labels) - 1) / len(labels)
	for i := range s.parts {
		if l, ok := s.holder[i]; !ok || !slices.Contains(labels, l) {
			return fmt.Sprintf("partition %d held by %q", i, l)
		}
	}
	for _, l := range labels {
		if n := len(s.held(l)); n > share {
			return fmt.Sprintf("%s holds %d partitions, above its share %d", l, n, share)
		}
	}
	return ""
}

func (s leaseState) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "members %v; backends %v;", s.members, s.backends)
	for _, l := range s.members {
		fmt.Fprintf(&b, " %s holds %v;", l, s.held(l))
	}
	fmt.Fprintf(&b, " %d of %d partitions held", len(s.holder), s.parts)
	return b.String()
}

// partitionConsumers returns the number of consumers of each partition
// queue, the waiting ones of its single active consumer included: one
// where a single process consumes it, two while a process that is gone
// (or letting it go) still has its consumer there.
func partitionConsumers(t *testing.T, ch *amqp.Channel, queue string, parts int) []int {
	t.Helper()
	out := make([]int, parts)
	for i := range parts {
		q, err := ch.QueueDeclarePassive(partitions.QueueName(queue, i), true, false, false, false, nil)
		require.NoError(t, err, "consumers of partition %d", i)
		out[i] = q.Consumers
	}
	return out
}

// partitionsOfAccounts returns the partition of each account of the
// ordered mode's events (acct-0 …), as the exchange routes them: it
// publishes one message with each account as routing key and takes them
// back from the partition queues. Call it before any worker consumes. Every
// partition must get an account, or a partition's consumption would not
// show in the applied events.
func (e *env) partitionsOfAccounts(parts, accounts int) map[string]int {
	e.t.Helper()
	ch := testbroker.Channel(e.t)
	require.NoError(e.t, ch.Confirm(false))
	for a := range accounts {
		dc, err := partitions.Publish(context.Background(), ch, e.queue, parts, fmt.Sprintf("acct-%d", a), amqp.Publishing{Body: []byte("{}")})
		require.NoError(e.t, err)
		ok, err := dc.WaitContext(context.Background())
		require.NoError(e.t, err)
		require.True(e.t, ok, "routing acct-%d", a)
	}
	// A partition queue has a single active consumer: no basic.get.
	out := map[string]int{}
	for i := range parts {
		q, err := ch.QueueDeclarePassive(partitions.QueueName(e.queue, i), true, false, false, false, nil)
		require.NoError(e.t, err, "partition %d", i)
		require.Positive(e.t, q.Messages, "partition %d gets some of the %d accounts", i, accounts)
		ds, err := ch.Consume(q.Name, "routes", true, false, false, false, nil)
		require.NoError(e.t, err, "take back partition %d's messages", i)
		for range q.Messages {
			select {
			case d := <-ds:
				out[d.RoutingKey] = i
			case <-time.After(10 * time.Second):
				e.t.Fatalf("partition %d: %d messages not delivered", i, q.Messages)
			}
		}
		require.NoError(e.t, ch.Cancel("routes", false))
	}
	require.Len(e.t, out, accounts, "every account routed to a partition")
	return out
}

// dbNow is the database's clock, which stamps the applied events.
func (e *env) dbNow() time.Time {
	e.t.Helper()
	var now time.Time
	require.NoError(e.t, e.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// firstAppliedSince returns, for each partition, each process that applied
// one of its events after since, and when it applied the first.
func (e *env) firstAppliedSince(since time.Time, partOf map[string]int) map[int]map[string]time.Time {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT split_part(message_id, '/', 1), label, min(at)
		FROM `+e.tables.QuotedSchema()+`.applied WHERE at > $1 GROUP BY 1, 2`, since)
	require.NoError(e.t, err, "read the events applied")
	defer rows.Close()
	out := map[int]map[string]time.Time{}
	for rows.Next() {
		var account, label string
		var at time.Time
		require.NoError(e.t, rows.Scan(&account, &label, &at))
		i, ok := partOf[account]
		require.True(e.t, ok, "account %q has a partition", account)
		if out[i] == nil {
			out[i] = map[string]time.Time{}
		}
		out[i][label] = at
	}
	require.NoError(e.t, rows.Err(), "read the events applied")
	return out
}

// pollUntil polls cond until it holds, and returns when it first did; cond
// says why it does not yet. Past deadline the test fails with what and the
// last reason.
func pollUntil(t *testing.T, deadline time.Time, what string, cond func() string) time.Time {
	t.Helper()
	for {
		why := cond()
		if why == "" {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not by the deadline: %s", what, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// eventFlow publishes the ordered mode's events to a partitioned consumer
// while a test kills and starts processes: every account's events in
// order (seq 1, 2, …), accounts interleaved at random, about 2,000 a second,
// and 10% of them a second time 20 duplicates later, until finish.
type eventFlow struct {
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
	events   int   // distinct events published; set before done closes
	err      error // set before done closes
}

// flowEvents starts publishing events over accounts accounts to e's
// partitioned queue of parts partitions; it stops when the test ends.
func (e *env) flowEvents(parts, accounts int) *eventFlow {
	e.t.Helper()
	ch := testbroker.Channel(e.t)
	require.NoError(e.t, ch.Confirm(false))
	f := &eventFlow{stop: make(chan struct{}), done: make(chan struct{})}
	go func() { // owned by f: ends with finish, or when the test ends
		defer close(f.done)
		f.events, f.err = f.run(ch, e.queue, parts, accounts)
	}()
	e.t.Cleanup(func() { f.stopOnce.Do(func() { close(f.stop) }); <-f.done })
	return f
}

func (f *eventFlow) run(ch *amqp.Channel, queue string, parts, accounts int) (int, error) {
	next := make([]int, accounts)
	var dups [][2]int // accounts' seqs to publish again
	var pending []*amqp.DeferredConfirmation
	publish := func(a, seq int) error {
		body, _ := json.Marshal(map[string]any{"account": fmt.Sprintf("acct-%d", a), "seq": seq})
		dc, err := partitions.Publish(context.Background(), ch, queue, parts, fmt.Sprintf("acct-%d", a), amqp.Publishing{
			MessageId: fmt.Sprintf("acct-%d/%d", a, seq), Body: body, DeliveryMode: amqp.Persistent,
		})
		if err != nil {
			return fmt.Errorf("publish acct-%d/%d: %w", a, seq, err)
		}
		pending = append(pending, dc)
		return nil
	}
	// One channel publishes in order: waiting for the confirms of a tick's
	// events together keeps each account's order.
	confirm := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, dc := range pending {
			ok, err := dc.WaitContext(ctx)
			if err != nil || !ok {
				return fmt.Errorf("confirm delivery %d: ok=%v: %v", dc.DeliveryTag, ok, err)
			}
		}
		pending = pending[:0]
		return nil
	}
	total := func() int {
		n := 0
		for _, s := range next {
			n += s
		}
		return n
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		for range 200 {
			a := rand.IntN(accounts)
			next[a]++
			if err := publish(a, next[a]); err != nil {
				return total(), err
			}
			if rand.IntN(10) == 0 {
				dups = append(dups, [2]int{a, next[a]})
			}
			if len(dups) > 20 {
				if err := publish(dups[0][0], dups[0][1]); err != nil {
					return total(), err
				}
				dups = dups[1:]
			}
		}
		if err := confirm(); err != nil {
			return total(), err
		}
		select {
		case <-f.stop:
			for _, d := range dups {
				if err := publish(d[0], d[1]); err != nil {
					return total(), err
				}
			}
			return total(), confirm()
		case <-tick.C:
		}
	}
}

// check fails the test if the events stopped flowing before finish.
func (f *eventFlow) check(t *testing.T) {
	t.Helper()
	select {
	case <-f.done:
		t.Fatalf("the events stopped flowing after %d: %v", f.events, f.err)
	default:
	}
}

// finish stops publishing (the pending duplicates published) and returns
// the number of distinct events published.
func (f *eventFlow) finish(t *testing.T) int {
	t.Helper()
	f.check(t)
	f.stopOnce.Do(func() { close(f.stop) })
	<-f.done
	require.NoError(t, f.err, "publishing events")
	return f.events
}

// logViolations logs the first events applied out of their account's
// order: who applied each and when (after the kill and after the join, on
// the database's clock), and the same of the event that should have come
// just before it. A handover that breaks the order shows as events of the
// new holder applied before the last ones its previous holder left.
func (e *env) logViolations(killAt, joinAt time.Time) {
	e.t.Helper()
	s := e.tables.QuotedSchema()
	rows, err := e.pool.Query(context.Background(), `
		SELECT v.account, v.seq, v.after, a.label, a.at, p.label, p.at
		FROM `+s+`.violations v
		JOIN `+s+`.applied a ON a.message_id = v.account || '/' || v.seq
		LEFT JOIN `+s+`.applied p ON p.message_id = v.account || '/' || (v.seq - 1)
		ORDER BY a.at LIMIT 20`)
	require.NoError(e.t, err, "read the violations")
	defer rows.Close()
	since := func(at time.Time) string {
		return fmt.Sprintf("kill+%v join+%v", at.Sub(killAt).Round(time.Millisecond), at.Sub(joinAt).Round(time.Millisecond))
	}
	for rows.Next() {
		var account, label string
		var seq, after int
		var at time.Time
		var plabel *string
		var pat *time.Time
		require.NoError(e.t, rows.Scan(&account, &seq, &after, &label, &at, &plabel, &pat))
		prev := "not applied"
		if plabel != nil {
			prev = fmt.Sprintf("by %s at %s", *plabel, since(*pat))
		}
		e.t.Logf("out of order: %s seq %d after %d, by %s at %s; seq %d %s", account, seq, after, label, since(at), seq-1, prev)
	}
	require.NoError(e.t, rows.Err(), "read the violations")
}
