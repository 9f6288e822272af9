package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// injection is one fault that happened, and how long the system took to
// recover from it.
type injection struct {
	Fault    string        `json:"fault"`
	Target   string        `json:"target"`
	At       time.Duration `json:"at_ns"` // after publishing started
	Detail   string        `json:"detail"`
	Recovery time.Duration `json:"recovery_ns"` // 0 while not recovered
	// Unmeasured: no message was published after the fault, so nothing
	// shows when its worker took up work again.
	Unmeasured bool   `json:"unmeasured,omitempty"`
	Skipped    string `json:"skipped,omitempty"`
	// Outcome is what became of the fault once it played out: where the
	// hung and poison messages ended, when the competing processes stopped.
	Outcome string `json:"outcome,omitempty"`
	// Processes are the compete fault's extra processes (their tags in the
	// liveness worker's applied log).
	Processes []string `json:"processes,omitempty"`
	// Doors are what the retention fault's cleanup, replays and redrives
	// did.
	Doors []door `json:"doors,omitempty"`
	// Unrestored says why a cluster fault could not put the cluster back:
	// the node killed not running again, no synchronous standby again.
	Unrestored string `json:"unrestored,omitempty"`
}

// injector runs the fault schedule.
type injector struct {
	h     *harness
	start time.Time
	mu    sync.Mutex
	done  []*injection
	wg    sync.WaitGroup // recovery watchers, and the retention faults' doors

	// The liveness faults' state (the run goroutine's).
	faulty   int // hung and poison messages published
	crashes  int // crash faults injected
	competes int // compete faults injected
	// faultyDead are the hung and poison messages' expected dead letters
	// (guarded by mu).
	faultyDead []deadLetter

	// retentions counts the retention faults injected (the run
	// goroutine's); retentionMu lets one at a time clean and go through
	// the doors, and keeps them apart from a PostgreSQL failover.
	retentions  int
	retentionMu sync.Mutex
}

// run injects the events at their time until they are all done or ctx ends,
// then waits for the recovery watchers (which end with ctx at the latest).
func (in *injector) run(ctx context.Context, events []event) {
	defer in.wg.Wait()
	for _, e := range events {
		t := time.NewTimer(time.Until(in.start.Add(e.at)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		inj := &injection{Fault: e.fault, At: time.Since(in.start)}
		var err error
		switch e.fault {
		case faultKill:
			err = in.kill(ctx, inj, e.target)
		case faultConnections:
			err = in.connections(ctx, inj)
		case faultBackends:
			err = in.backends(ctx, inj)
		case faultDispatcher:
			err = in.dispatcher(ctx, inj)
		case faultHang:
			err = in.hang(ctx, inj)
		case faultCrash:
			err = in.crash(ctx, inj)
		case faultCompete:
			err = in.compete(ctx, inj)
		case faultRetention:
			err = in.retention(ctx, inj)
		case faultNode:
			err = in.node(ctx, inj)
		case faultPGFailover:
			err = in.pgFailover(ctx, inj)
		case faultFreeze:
			err = in.freeze(ctx, inj)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			inj.Skipped = err.Error()
			in.h.logf("fault %s not injected: %v", e.fault, err)
		} else {
			in.h.logf("fault %s %s: %s", inj.Fault, inj.Target, inj.Detail)
		}
		in.mu.Lock()
		in.done = append(in.done, inj)
		in.mu.Unlock()
	}
}

// injections returns what was injected, once run has returned.
func (in *injector) injections() []injection {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make([]injection, len(in.done))
	for i, inj := range in.done {
		out[i] = *inj
		out[i].Doors = slices.Clone(inj.Doors)
	}
	return out
}

// faultyDeadLetters returns the dead letters the hung and poison messages
// published so far must become.
func (in *injector) faultyDeadLetters() []deadLetter {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Clone(in.faultyDead)
}

// kill SIGKILLs the worker of ex; the supervisor starts it again at once.
func (in *injector) kill(ctx context.Context, inj *injection, ex example) error {
	p := in.h.workers[ex]
	inj.Target = ex.String()
	pid, err := p.kill()
	if err != nil {
		return err
	}
	t0 := time.Now()
	inj.Detail = fmt.Sprintf("SIGKILL pid %d", pid)
	in.watch(ctx, inj, t0, []example{ex})
	return nil
}

// dispatcher waits until the payments worker's dispatcher has gateway calls
// in flight (the gateway stalls some), then SIGKILLs the worker. The calls'
// effects stay in_flight until their lease ends; recovery is the time until
// all of them succeeded.
func (in *injector) dispatcher(ctx context.Context, inj *injection) error {
	p := in.h.workers[payments]
	inj.Target = payments.String()
	deadline := time.Now().Add(15 * time.Second)
	for {
		pid := p.pid()
		ids, err := in.h.db.inFlight(ctx, pid)
		if err != nil {
			return err
		}
		if len(ids) > 0 {
			killed, err := p.kill()
			if err != nil {
				return err
			}
			if killed != pid {
				continue // restarted in between: look again
			}
			t0 := time.Now()
			inj.Detail = fmt.Sprintf("SIGKILL pid %d with %d gateway calls in flight", pid, len(ids))
			in.wg.Go(func() {
				if d, ok := in.h.db.waitSucceeded(ctx, ids, t0); ok {
					in.recovered(inj, d)
				}
			})
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("no gateway call in flight within 15s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// connections closes every broker connection of the run's workers, to any
// node: AMQP connections named idem:* through rabbitmqctl close_connection
// (the broker closes them with CONNECTION_FORCED), stream connections with
// ss -K (the socket is destroyed under the client: RabbitMQ 3.10 cannot
// close a stream connection from rabbitmqctl). Only connections whose
// client port belongs to one of this run's worker processes are touched.
func (in *injector) connections(ctx context.Context, inj *injection) error {
	inj.Target = "all workers"
	amqpPorts, streamPorts, err := in.h.brokerSockets()
	if err != nil {
		return err
	}
	closed, err := in.h.closeAMQP(ctx, amqpPorts)
	if err != nil {
		return err
	}
	killed, err := killSockets(ctx, streamPorts, in.h.streamPorts)
	if errors.Is(err, errNoneDestroyed) && in.h.streamSocketsGone(streamPorts) {
		// The stream client opens short-lived connections too: those that
		// closed between the listing and ss -K are no sign that ss -K
		// cannot destroy sockets; one still open would be.
		err = nil
	}
	if err != nil {
		return err
	}
	if closed+killed == 0 {
		return errors.New("no broker connection of this run found")
	}
	inj.Detail = fmt.Sprintf("%d AMQP connections closed by the broker, %d stream sockets destroyed", closed, killed)
	in.watch(ctx, inj, time.Now(), in.h.cfg.examples)
	return nil
}

// backends terminates every PostgreSQL session whose application_name is
// one of the run's workers'.
func (in *injector) backends(ctx context.Context, inj *injection) error {
	inj.Target = "all workers"
	n, err := in.h.db.terminate(ctx, in.h.appNames())
	if err != nil {
		return err
	}
	if n == 0 {
		return errors.New("no PostgreSQL session of this run's workers found")
	}
	inj.Detail = fmt.Sprintf("pg_terminate_backend on %d sessions", n)
	in.watch(ctx, inj, time.Now(), in.h.cfg.examples)
	return nil
}

// brokerSockets returns the client ports of the run's workers' connections
// to the broker: AMQP and stream.
func (h *harness) brokerSockets() (amqpPorts, streamPorts map[int]bool, err error) {
	socks, err := h.workerSockets()
	if err != nil {
		return nil, nil, err
	}
	amqpPorts, streamPorts = map[int]bool{}, map[int]bool{}
	for _, s := range socks {
		switch {
		case h.amqpPorts[s.remotePort]:
			amqpPorts[s.localPort] = true
		case h.streamPorts[s.remotePort]:
			streamPorts[s.localPort] = true
		}
	}
	return amqpPorts, streamPorts, nil
}

// workerSockets lists the TCP connections of the run's running workers,
// and an error for each whose sockets could not be read (it may have
// exited meanwhile).
func (h *harness) workerSockets() ([]socket, error) {
	var all []socket
	var errs []error
	for _, p := range h.workerList() {
		pid := p.pid()
		if pid == 0 {
			continue
		}
		socks, err := socketsOf(pid)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		all = append(all, socks...)
	}
	return all, errors.Join(errs...)
}

// streamSocketsGone reports whether none of the workers' stream
// connections with these client ports is open any more.
func (h *harness) streamSocketsGone(ports map[int]bool) bool {
	_, open, err := h.brokerSockets()
	if err != nil {
		return false
	}
	for p := range open {
		if ports[p] {
			return false
		}
	}
	return true
}

// watch measures recovery: the time from t0 until, in every example of exs,
// a valid message published after t0 has been processed, and every
// condition of more held (each returns the time since t0 it took).
func (in *injector) watch(ctx context.Context, inj *injection, t0 time.Time, exs []example, more ...func(context.Context) (time.Duration, bool)) {
	in.wg.Go(func() {
		var worst time.Duration
		for _, cond := range more {
			d, ok := cond(ctx)
			if !ok {
				return
			}
			worst = max(worst, d)
		}
		for _, ex := range exs {
			id, ok := in.h.pub.probeAfter(ctx, ex, t0)
			if !ok {
				if ctx.Err() == nil {
					in.mu.Lock()
					inj.Unmeasured = true
					in.mu.Unlock()
				}
				return
			}
			d, ok := in.h.db.waitProcessed(ctx, ex, id, t0)
			if !ok {
				return
			}
			worst = max(worst, d)
		}
		in.recovered(inj, worst)
	})
}

func (in *injector) recovered(inj *injection, d time.Duration) {
	in.mu.Lock()
	inj.Recovery = d
	in.mu.Unlock()
}

// socket is one TCP connection of a process.
type socket struct{ localPort, remotePort int }

// socketsOf lists the TCP connections of process pid from /proc.
func socketsOf(pid int) ([]socket, error) {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, fmt.Errorf("list sockets of pid %d: %w", pid, err)
	}
	inodes := map[string]bool{}
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var out []socket
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			out = append(out, socket{localPort: hexPort(fields[1]), remotePort: hexPort(fields[2])})
		}
		f.Close()
	}
	return out, nil
}

// portFilter is an ss filter that matches any of ports on side (sport,
// dport).
func portFilter(side string, ports map[int]bool) string {
	var terms []string
	for p := range ports {
		terms = append(terms, fmt.Sprintf("%s = :%d", side, p))
	}
	slices.Sort(terms)
	return strings.Join(terms, " or ")
}

// hexPort reads the port of a /proc/net/tcp address (ADDR:PORT in hex).
func hexPort(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	n, _ := strconv.ParseInt(addr[i+1:], 16, 32)
	return int(n)
}

// killSockets destroys the local TCP sockets with one of the given source
// ports and destination ports with ss -K, and returns how many it
// destroyed.
func killSockets(ctx context.Context, ports, dports map[int]bool) (int, error) {
	if len(ports) == 0 {
		return 0, nil
	}
	filter := fmt.Sprintf("( %s ) and ( %s )", portFilter("sport", ports), portFilter("dport", dports))
	out, err := exec.CommandContext(ctx, "ss", "-K", "-H", "-tn", filter).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("ss -K %s: %w: %s", filter, err, out)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) != "" {
			n++
		}
	}
	if n == 0 {
		return 0, errNoneDestroyed
	}
	return n, nil
}

// errNoneDestroyed is killSockets's answer when ss -K destroyed no socket.
var errNoneDestroyed = errors.New("ss -K destroyed no socket (it needs CAP_NET_ADMIN and a kernel with CONFIG_INET_DIAG_DESTROY)")
