package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// build compiles the example binaries into dir, once, so that a SIGKILL hits
// the worker itself and not `go run`.
func build(ctx context.Context, dir string, examples []example) (map[example]string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return nil, fmt.Errorf("find the module: go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return nil, errors.New("run the soak from inside the idem module")
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	bins := map[example]string{}
	for _, ex := range examples {
		args = append(args, "./examples/"+ex.String())
		bins[ex] = filepath.Join(dir, ex.String())
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Dir(mod)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build the examples: %w\n%s", err, stderr.String())
	}
	return bins, nil
}

// proc is one supervised process: a worker, the gateway or the mail stub. A
// worker that the soak kills is started again at once; a process that exits
// on its own is a finding, recorded and (for workers) started again.
type proc struct {
	name    string
	path    string
	args    []string
	env     []string
	logDir  string
	restart bool // start it again when it exits

	mu          sync.Mutex
	cmd         *exec.Cmd
	incarnation int
	killing     bool      // the current incarnation is being killed by the soak
	up          time.Time // when the current incarnation started
	running     bool
	unexpected  []string // exits nobody asked for
	exited      chan struct{}
}

// supervisor owns the processes of a run and the goroutines that wait for
// them.
type supervisor struct {
	ctx   context.Context // ends the processes when cancelled
	wg    sync.WaitGroup
	procs []*proc
}

// start starts p and a goroutine that restarts it while the supervisor runs.
func (s *supervisor) start(p *proc) error {
	if err := p.spawn(); err != nil {
		return err
	}
	s.procs = append(s.procs, p)
	s.wg.Go(func() { s.watch(p) })
	return nil
}

func (s *supervisor) watch(p *proc) {
	for {
		p.mu.Lock()
		cmd, exited := p.cmd, p.exited
		p.mu.Unlock()
		err := cmd.Wait()
		p.mu.Lock()
		p.running = false
		killed := p.killing
		p.killing = false
		if !killed && s.ctx.Err() == nil {
			p.unexpected = append(p.unexpected, fmt.Sprintf("%s (incarnation %d) exited by itself: %v; log %s",
				p.name, p.incarnation, err, p.logPath()))
		}
		p.mu.Unlock()
		close(exited)
		if s.ctx.Err() != nil || !p.restart {
			return
		}
		if !killed {
			select { // do not spin on a process that cannot start
			case <-s.ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
		if err := p.spawn(); err != nil {
			p.mu.Lock()
			p.unexpected = append(p.unexpected, fmt.Sprintf("%s could not be started again: %v", p.name, err))
			p.mu.Unlock()
			return
		}
	}
}

// stop ends every process: SIGTERM, then SIGKILL after grace, and waits for
// the goroutines watching them.
func (s *supervisor) stop(cancel context.CancelFunc, grace time.Duration) {
	cancel()
	for _, p := range s.procs {
		p.signal(syscall.SIGTERM)
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	for _, p := range s.procs {
		p.signal(syscall.SIGKILL)
	}
	<-done
}

// unexpected returns every exit nobody asked for.
func (s *supervisor) unexpected() []string {
	var out []string
	for _, p := range s.procs {
		p.mu.Lock()
		out = append(out, p.unexpected...)
		p.mu.Unlock()
	}
	return out
}

func (p *proc) logPath() string {
	return filepath.Join(p.logDir, fmt.Sprintf("%s.%d.log", p.name, p.incarnation))
}

// spawn starts a new incarnation of p, its output in a log file of its own.
func (p *proc) spawn() error {
	p.mu.Lock()
	defer p.mu.Unlock()
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
