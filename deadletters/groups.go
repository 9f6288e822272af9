package deadletters

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
)

// GroupBy says how Groups groups dead letters.
type GroupBy string

// The groupings of Groups.
const (
	// ByReason groups dead letters by reason.
	ByReason GroupBy = "reason"
	// ByConsumerReason groups dead letters by consumer, then reason.
	ByConsumerReason GroupBy = "consumer,reason"
)

// DefaultCountCap is how many dead letters Groups counts in a group unless
// GroupFilter.CountCap says otherwise.
const DefaultCountCap = 10000

// GroupFilter selects and groups the dead letters of Groups.
type GroupFilter struct {
	// By is the grouping. Default: ByReason.
	By GroupBy
	// Consumer keeps the dead letters of this consumer; empty keeps all.
	Consumer string
	// CountCap is the most dead letters counted in a group: a group with
	// more says so (Group.Capped) instead of counting them all, so that a
	// group of millions costs what one of CountCap does. Default:
	// DefaultCountCap.
	CountCap int
	// Limit is the most groups returned. Default: 100.
	Limit int
}

// Group is the dead letters waiting for an operator that share a reason
// (and a consumer).
type Group struct {
	// Consumer is the group's consumer: "" grouped ByReason without a
	// GroupFilter.Consumer.
	Consumer string
	// Reason is the group's reason.
	Reason string
	// Count is how many dead letters the group holds, or GroupFilter.CountCap
	// when Capped.
	Count int64
	// Capped reports that the group holds more than Count dead letters.
	Capped bool
	// Oldest and Newest are when the group's first and last dead letters
	// committed.
	Oldest, Newest time.Time
}

// groupsSQL walks the groups in their index, one key after the other
// ({key} is the key's columns, {k} the same of the group before), at most
// $2 + 1 of them; the first entry of each is its oldest. Then it reads each
// group's newest, the last entry up to its key, and its count, capped at
// $1 + 1 entries ({match} is the group's key). Each read asks for the
// index's own order over a range of reasons, never for one reason, so
// that only the group's index serves it: a sequential scan would sort the
// table, and for one reason the index on dead_lettered_at alone would
// serve the order too, reading the whole table for a group whose dead
// letters are old. {extra} narrows the walk and the newest to consumer
// $3, as a range too.
const groupsSQL = `WITH RECURSIVE k AS (
	(SELECT {cols}, dead_lettered_at AS oldest, 1 AS n FROM {table}
	WHERE redriven_at IS NULL {extra} ORDER BY {order} LIMIT 1)
	UNION ALL
	SELECT x.*, k.n + 1 FROM k CROSS JOIN LATERAL (
		SELECT {cols}, dead_lettered_at FROM {table}
		WHERE redriven_at IS NULL {extra} AND {key} > {k} ORDER BY {order} LIMIT 1) x
	WHERE k.n <= $2
)
SELECT {out},
	(SELECT count(*) FROM (SELECT FROM {table}
		WHERE redriven_at IS NULL AND {match} ORDER BY {order} LIMIT $1 + 1) c),
	k.oldest,
	(SELECT dead_lettered_at FROM {table}
		WHERE redriven_at IS NULL {extra} AND {key} <= {k} ORDER BY {desc} LIMIT 1)
FROM k ORDER BY k.n`

// groupsStatement returns groupsSQL for tables and f: by reason in the
// index on (reason, dead_lettered_at); by consumer and reason, or the
// reasons of one consumer, in the index on (consumer, reason,
// dead_lettered_at).
func groupsStatement(tables idem.Tables, f GroupFilter) string {
	table := tables.WithDefaults().Table("dead_letters")
	if f.By != ByConsumerReason && f.Consumer == "" {
		return strings.NewReplacer("{table}", table, "{cols}", "reason", "{key}", "reason", "{k}", "k.reason",
			"{out}", "''::text, k.reason", "{extra}", "", "{match}", "(reason, dead_lettered_at) >= (k.reason, k.oldest) AND reason <= k.reason",
			"{order}", "reason, dead_lettered_at", "{desc}", "reason DESC, dead_lettered_at DESC").Replace(groupsSQL)
	}
	extra := ""
	if f.Consumer != "" {
		extra = "AND consumer >= $3 AND consumer <= $3"
	}
	return strings.NewReplacer("{table}", table, "{cols}", "consumer, reason", "{key}", "(consumer, reason)",
		"{k}", "(k.consumer, k.reason)", "{out}", "k.consumer, k.reason", "{extra}", extra,
		"{match}", "consumer = k.consumer AND (reason, dead_lettered_at) >= (k.reason, k.oldest) AND reason <= k.reason", "{order}", "consumer, reason, dead_lettered_at",
		"{desc}", "consumer DESC, reason DESC, dead_lettered_at DESC").Replace(groupsSQL)
}

// Groups returns the dead letters not redriven in tables, grouped as f
// says, each group with its count, oldest and newest, in the order of its
// key (reason, or consumer then reason): at most f.Limit groups, and more
// reports that there are others after them. One statement reads them,
// through an index (migration 0018): it skips from one group to the next,
// and reads at most f.CountCap entries of each, whatever the number of
// dead letters.
func Groups(ctx context.Context, q Querier, tables idem.Tables, f GroupFilter) (groups []Group, more bool, err error) {
	switch f.By {
	case "":
		f.By = ByReason
	case ByReason, ByConsumerReason:
	default:
		return nil, false, fmt.Errorf("deadletters: groups: %w: group by %q (want %q or %q)", idem.ErrConfig, f.By, ByReason, ByConsumerReason)
	}
	if f.CountCap <= 0 {
		f.CountCap = DefaultCountCap
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	args := []any{f.CountCap, f.Limit}
	if f.Consumer != "" {
		args = append(args, f.Consumer)
	}
	rows, err := q.Query(ctx, groupsStatement(tables, f), args...)
	if err != nil {
		return nil, false, fmt.Errorf("deadletters: groups: %w", err)
	}
	groups, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Group, error) {
		var g Group
		err := r.Scan(&g.Consumer, &g.Reason, &g.Count, &g.Oldest, &g.Newest)
		if g.Count > int64(f.CountCap) {
			g.Count, g.Capped = int64(f.CountCap), true
		}
		return g, err
	})
	if err != nil {
		return nil, false, fmt.Errorf("deadletters: groups: %w", err)
	}
	if len(groups) > f.Limit {
		return groups[:f.Limit], true, nil
	}
	return groups, false, nil
}
