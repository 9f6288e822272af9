package testcluster

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PGPrimary returns the URL of the PostgreSQL node that is primary now, one
// of PGNodeURLs.
func (c *Cluster) PGPrimary(tb testing.TB) string {
	tb.Helper()
	return c.pgNode(tb, false)
}

// PGStandby returns the URL of the PostgreSQL node that is a standby now,
// one of PGNodeURLs.
func (c *Cluster) PGStandby(tb testing.TB) string {
	tb.Helper()
	return c.pgNode(tb, true)
}

func (c *Cluster) pgNode(tb testing.TB, standby bool) string {
	tb.Helper()
	for _, u := range c.PGNodeURLs {
		if inRecovery, err := recovering(u); err == nil && inRecovery == standby {
			return u
		}
	}
	tb.Fatalf("testcluster: no PostgreSQL node answers as %s", map[bool]string{false: "primary", true: "standby"}[standby])
	return ""
}

func recovering(url string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	var r bool
	err = conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&r)
	return r, err
}

// StopPGPrimary stops the primary at once (pg_ctl stop -m immediate), as a
// lost host would: no checkpoint, connections cut. The pair is restored
// when the test ends, see RestorePG.
func (c *Cluster) StopPGPrimary(tb testing.TB) {
	tb.Helper()
	c.restorePGAtEnd(tb)
	c.must(tb, "pg-stop-primary")
}

// PromotePGStandby promotes the standby and returns once it accepts writes;
// PGURL then reaches it. A synchronous setting is dropped on the promoted
// node, which has no standby to wait for. The pair is restored when the
// test ends.
func (c *Cluster) PromotePGStandby(tb testing.TB) {
	tb.Helper()
	c.restorePGAtEnd(tb)
	c.must(tb, "pg-promote")
}

// RestorePG brings the pair back to one primary and one streaming standby,
// keeping the data: a stopped primary that nobody replaced is started again;
// a node that was replaced becomes a fresh standby of the new primary. The
// replication mode (SetPGSync) is applied again.
func (c *Cluster) RestorePG(tb testing.TB) {
	tb.Helper()
	c.must(tb, "pg-rejoin")
}

// SetPGSync turns synchronous replication on (synchronous_standby_names
// names the standby, synchronous_commit = remote_apply: a commit returns once
// the standby applied it) or off. It is turned off when the test ends.
func (c *Cluster) SetPGSync(tb testing.TB, on bool) {
	tb.Helper()
	mode := "async"
	if on {
		mode = "sync"
		tb.Cleanup(func() {
			if _, err := c.run(verbTimeout, "pg-mode", "async"); err != nil {
				tb.Errorf("testcluster: back to asynchronous replication: %v", err)
			}
		})
	}
	c.must(tb, "pg-mode", mode)
}

func (c *Cluster) restorePGAtEnd(tb testing.TB) {
	tb.Cleanup(func() {
		if _, err := c.run(verbTimeout, "pg-rejoin"); err != nil {
			tb.Errorf("testcluster: restore the PostgreSQL pair after the test: %v", err)
		}
	})
}
