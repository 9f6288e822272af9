package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/idem/internal/testkit/soak/soakworker"
)

// build compiles the example binaries (and the soak itself, for its
// liveness worker) into dir, once, so that a SIGKILL hits the worker itself
// and not `go run`; and the command-line packages of cli (idem, for the
// retention fault), each into dir under its last path element.
func build(ctx context.Context, dir string, examples []example, cli ...string) (map[example]string, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return nil, err
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	bins := map[example]string{}
	for _, ex := range examples {
		args = append(args, ex.pkg())
		bins[ex] = filepath.Join(dir, ex.bin())
	}
	args = append(args, cli...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build the examples: %w\n%s", err, stderr.String())
	}
	return bins, nil
}

// moduleRoot is the directory of the idem module the soak runs in.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find the module: go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run the soak from inside the idem module")
	}
	return filepath.Dir(mod), nil
}

// proc is one supervised process: a worker, the gateway or the mail stub. A
// worker that the soak kills is started again at once, and so is a liveness
// worker that a poison message crashed; a process that exits on its own
// otherwise is a finding, recorded and (for workers) started again.
type proc struct {
	name   string
	path   string
	args   []string
	env    []string
	logDir string
	// poison says the process may crash on purpose: an exit with a crash
	// marker in its log (soakworker.ParseCrash) and the status the marker's
	// fault exits with is a poison crash, not a finding.
	poison bool

	mu          sync.Mutex
	restart     bool // start it again when it exits
	cmd         *exec.Cmd
	incarnation int
	killing     bool      // the current incarnation is being killed by the soak
	stopping    bool      // the soak asked the process to stop (SIGTERM) for good
	up          time.Time // when the current incarnation started
	running     bool
	unexpected  []string // exits nobody asked for
	crashes     []string // the poison messages that crashed an incarnation, one per crash
	exited      chan struct{}
}

// supervisor owns the processes of a run and the goroutines that wait for
// them.
type supervisor struct {
	ctx   context.Context // ends the processes when cancelled
	wg    sync.WaitGroup
	mu    sync.Mutex
	procs []*proc
}

// start starts p and a goroutine that restarts it while the supervisor runs.
func (s *supervisor) start(p *proc) error {
	if err := p.spawn(); err != nil {
		return err
	}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	s.wg.Go(func() { s.watch(p) })
	return nil
}

// all returns the processes started so far.
func (s *supervisor) all() []*proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.procs)
}

func (s *supervisor) watch(p *proc) {
	for {
		p.mu.Lock()
		cmd, exited := p.cmd, p.exited
		p.mu.Unlock()
		err := cmd.Wait()
		asked := p.exitedWith(err, s.ctx.Err() != nil)
		p.mu.Lock()
		restart := p.restart
		p.mu.Unlock()
		close(exited)
		if s.ctx.Err() != nil || !restart {
			return
		}
		if !asked {
			select { // do not spin on a process that cannot start
			case <-s.ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
		if err := p.spawn(); errors.Is(err, errStopped) {
			return
		} else if err != nil {
			p.mu.Lock()
			p.unexpected = append(p.unexpected, fmt.Sprintf("%s could not be started again: %v", p.name, err))
			p.mu.Unlock()
			return
		}
	}
}

// exitedWith records the end of the current incarnation, which Wait
// returned err for, and reports whether the soak asked for it: a kill, a
// poison crash, or a stop it ended cleanly. ending says the whole run is
// being stopped.
func (p *proc) exitedWith(err error, ending bool) (asked bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.running = false
	killed, stopping := p.killing, p.stopping
	p.killing = false
	if killed {
		return true
	}
	if id, ok := p.poisonCrash(err); ok { // while running, or while draining on SIGTERM
		p.crashes = append(p.crashes, id)
		return true
	}
	if stopping || ending {
		if err != nil && !ending {
			p.unexpected = append(p.unexpected, fmt.Sprintf("%s (incarnation %d) did not stop cleanly on SIGTERM: %v; log %s",
				p.name, p.incarnation, err, p.logPath()))
		}
		return true
	}
	p.unexpected = append(p.unexpected, fmt.Sprintf("%s (incarnation %d) exited by itself: %v; log %s",
		p.name, p.incarnation, err, p.logPath()))
	return false
}

// poisonCrash reports whether the incarnation that ended with err was
// crashed by a poison message, as its log and exit status say, and which.
func (p *proc) poisonCrash(err error) (id string, ok bool) {
	ee, isExit := errors.AsType[*exec.ExitError](err)
	if !p.poison || !isExit {
		return "", false
	}
	log, rerr := os.ReadFile(p.logPath())
	if rerr != nil {
		return "", false
	}
	fault, id, ok := soakworker.ParseCrash(log)
	if !ok || ee.ExitCode() != soakworker.ExitStatus(fault) {
		return "", false
	}
	return id, true
}

// stop ends every process: SIGTERM, then SIGKILL after grace, and waits for
// the goroutines watching them.
func (s *supervisor) stop(cancel context.CancelFunc, grace time.Duration) {
	cancel()
	procs := s.all()
	for _, p := range procs {
		p.signal(syscall.SIGTERM)
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	for _, p := range procs {
		p.signal(syscall.SIGKILL)
	}
	<-done
}

// unexpected returns every exit nobody asked for.
func (s *supervisor) unexpected() []string {
	var out []string
	for _, p := range s.all() {
		p.mu.Lock()
		out = append(out, p.unexpected...)
		p.mu.Unlock()
	}
	return out
}

// crashes returns, per poison crash of the run's processes, the message
// that caused it.
func (s *supervisor) crashes() []string {
	var out []string
	for _, p := range s.all() {
		p.mu.Lock()
		out = append(out, p.crashes...)
		p.mu.Unlock()
	}
	return out
}

func (p *proc) logPath() string {
	return filepath.Join(p.logDir, fmt.Sprintf("%s.%d.log", p.name, p.incarnation))
}

// errStopped is spawn's answer once the soak stopped the process for good.
var errStopped = errors.New("stopped")

// spawn starts a new incarnation of p, its output in a log file of its own.
func (p *proc) spawn() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		return errStopped
	}
	p.incarnation++
	f, err := os.Create(p.logPath())
	if err != nil {
		return err
	}
	defer f.Close() // the child holds its own descriptor
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	// The children die with the soak, even when it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.up, p.running, p.exited = cmd, time.Now(), true, make(chan struct{})
	return nil
}

// pid returns the running incarnation's process id, or 0.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.running {
		return 0
	}
	return p.cmd.Process.Pid
}

// kill SIGKILLs the running incarnation and waits until it is gone; the
// supervisor starts the next one. It returns the killed process id.
func (p *proc) kill() (int, error) {
	p.mu.Lock()
	if !p.running || p.killing {
		p.mu.Unlock()
		return 0, fmt.Errorf("%s is not running", p.name)
	}
	p.killing = true
	pid, exited := p.cmd.Process.Pid, p.exited
	err := p.cmd.Process.Signal(syscall.SIGKILL)
	p.mu.Unlock()
	if err != nil {
		return pid, fmt.Errorf("kill %s: %w", p.name, err)
	}
	<-exited
	return pid, nil
}

// stop ends the process for good: SIGTERM, and if it is still running
// after grace (a finding), SIGQUIT, on which the Go runtime writes every
// goroutine's stack to the process's log before it exits, then SIGKILL if
// even that did not end it. It returns once the process is gone.
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	p.restart, p.stopping = false, true
	running, exited := p.running, p.exited
	if running {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	p.mu.Unlock()
	if !running {
		return
	}
	select {
	case <-exited:
		return
	case <-time.After(grace):
	}
	p.mu.Lock()
	p.unexpected = append(p.unexpected, fmt.Sprintf("%s did not stop within %s of SIGTERM; its goroutines are in its log", p.name, grace))
	if p.running {
		p.killing = true
		_ = p.cmd.Process.Signal(syscall.SIGQUIT)
	}
	p.mu.Unlock()
	select {
	case <-exited:
		return
	case <-time.After(5 * time.Second):
	}
	p.mu.Lock()
	if p.running {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	p.mu.Unlock()
	<-exited
}

func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		_ = p.cmd.Process.Signal(sig)
	}
}

// tail returns the last n lines of the current incarnation's log.
func (p *proc) tail(n int) string {
	p.mu.Lock()
	path := p.logPath()
	p.mu.Unlock()
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
