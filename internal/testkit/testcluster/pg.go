package testcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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

// FreezePGPrimary stops every process of the primary with SIGSTOP, as a
// gray failure would: the kernel still accepts TCP connections to its port
// and acknowledges what is sent, and nothing answers. It returns the URL
// of the node it froze. The processes are thawed (SIGCONT) when the test
// ends, before the pair is restored (see RestorePG): a frozen node cannot
// be stopped.
func (c *Cluster) FreezePGPrimary(tb testing.TB) string {
	tb.Helper()
	c.restorePGAtEnd(tb)
	node := c.PGPrimary(tb)
	pids, err := serverProcesses(node)
	if err != nil {
		tb.Fatalf("testcluster: the primary's processes: %v", err)
	}
	tb.Cleanup(func() { signalAll(tb, pids, syscall.SIGCONT) }) // runs before the restore
	signalAll(tb, pids, syscall.SIGSTOP)
	return node
}

// serverProcesses returns the postmaster of the server at url and its
// children, the postmaster first.
func serverProcesses(url string) ([]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	var dir string
	if err := conn.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dir); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return nil, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return nil, fmt.Errorf("postmaster.pid: %w", err)
	}
	pids := []int{postmaster}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid …: comm may hold spaces, so read after ')'.
		_, rest, ok := strings.Cut(string(b), ") ")
		fields := strings.Fields(rest)
		if !ok || len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == postmaster {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// signalAll sends sig to every process of pids, reporting a failure.
func signalAll(tb testing.TB, pids []int, sig syscall.Signal) {
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			tb.Errorf("testcluster: %s to PostgreSQL process %d: %v", sig, pid, err)
		}
	}
}
