package console

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/partlease"
)

// Partitions are spread over a consumer's processes by advisory locks
// (internal/partlease): no table records who holds what, pg_locks does. A
// lease is keyed by schema, consumer name and queue; the console finds the
// partitioned consumers by the partition queues (queue.pN) its recent
// inbox rows and dead letters came from, computes their lock keys, and
// reads their holders in pg_locks, with each holder's session from
// pg_stat_activity (a session's start is when its process joined: a lock
// records no time of its own).

// maxPartitions is the most partitions the console looks for per consumer.
const maxPartitions = 256

// partitionQueue matches a partition queue's name (amqpnames.PartitionQueue).
var partitionQueue = regexp.MustCompile(`^(.+)\.p([0-9]+)$`)

// leaseCandidate is a consumer that may run partitions of queue.
type leaseCandidate struct{ Consumer, Queue string }

// leaseView is what the console sees of one partitioned consumer.
type leaseView struct {
	Consumer, Queue string
	// Members is the number of processes that joined.
	Members int
	// Holders are the sessions holding partitions, by process id.
	Holders []holderView
	// Free are the partitions below the highest held one that nobody holds.
	Free []int
}

// holderView is one process holding partitions.
type holderView struct {
	PID        int32
	App        string
	Client     string
	Since      time.Time
	Partitions []int
}

// advisoryLock is one row of advisorySQL.
type advisoryLock struct {
	key    int64
	mode   string
	pid    int32
	app    string
	client string
	since  *time.Time
}

// candidates returns the partitioned consumers that sources (per
// consumer) name.
func candidates(sources map[string][]string) []leaseCandidate {
	seen := map[leaseCandidate]bool{}
	var out []leaseCandidate
	for consumer, list := range sources {
		for _, src := range list {
			if m := partitionQueue.FindStringSubmatch(src); m != nil {
				c := leaseCandidate{consumer, m[1]}
				if !seen[c] {
					seen[c] = true
					out = append(out, c)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b leaseCandidate) int {
		if a.Consumer != b.Consumer {
			return cmpString(a.Consumer, b.Consumer)
		}
		return cmpString(a.Queue, b.Queue)
	})
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// leases reads the holders of each candidate's partitions in pg_locks.
// Console query: partlease keeps no table, and no library function reads
// the locks.
func (s *store) leases(ctx context.Context, cands []leaseCandidate) ([]leaseView, error) {
	if len(cands) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, s.sql.advisory)
	if err != nil {
		return nil, fmt.Errorf("advisory locks: %w", err)
	}
	locks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (advisoryLock, error) {
		var l advisoryLock
		err := r.Scan(&l.key, &l.mode, &l.pid, &l.app, &l.client, &l.since)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("advisory locks: %w", err)
	}
	byKey := map[int64][]advisoryLock{}
	for _, l := range locks {
		byKey[l.key] = append(byKey[l.key], l)
	}
	var out []leaseView
	for _, c := range cands {
		out = append(out, leaseOf(c, s.cfg.Tables.Schema, byKey))
	}
	return out, nil
}

// leaseOf is what the locks byKey say of candidate c's lease.
func leaseOf(c leaseCandidate, schema string, byKey map[int64][]advisoryLock) leaseView {
	member, keys := partlease.LockKeys(schema+"/"+c.Consumer+"/"+c.Queue, maxPartitions)
	v := leaseView{Consumer: c.Consumer, Queue: c.Queue, Members: len(byKey[member])}
	holders := map[int32]*holderView{}
	highest := -1
	for i, k := range keys {
		for _, l := range byKey[k] {
			h := holders[l.pid]
			if h == nil {
				h = &holderView{PID: l.pid, App: l.app, Client: l.client}
				if l.since != nil {
					h.Since = *l.since
				}
				holders[l.pid] = h
			}
			h.Partitions = append(h.Partitions, i)
			highest = max(highest, i)
		}
	}
	held := map[int]bool{}
	for _, h := range holders {
		v.Holders = append(v.Holders, *h)
		for _, p := range h.Partitions {
			held[p] = true
		}
	}
	slices.SortFunc(v.Holders, func(a, b holderView) int { return a.Partitions[0] - b.Partitions[0] })
	for i := 0; i < highest; i++ {
		if !held[i] {
			v.Free = append(v.Free, i)
		}
	}
	return v
}

// partitionsData is the partitions page.
type partitionsData struct {
	Leases []leaseView
	Note   string
}

// partitions shows which process holds which partition, and since when.
func (c *Console) partitions(w http.ResponseWriter, r *http.Request, s *session) {
	ctx := r.Context()
	recent, err := c.store.recentSources(ctx)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	leases, err := c.store.leases(ctx, candidates(recent))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, s, http.StatusOK, "partitions", "Partitions", partitionsData{Leases: leases,
		Note: "Partitioned consumers are found by the partition queues (QUEUE.pN) of their inbox rows and dead letters of the last " +
			strconv.Itoa(int(recentWindow.Hours())) + " hour; a consumer idle for longer is not listed."})
}
