package streamio

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/internal/streamclient/stream"

	"github.com/idemkit/idem/internal/amqpurl"
)

// DefaultURL is used by URLFromEnv when neither IDEM_STREAM_URL nor
// IDEM_AMQP_URL is set.
const DefaultURL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/"

// DefaultStreamPort is the port of RabbitMQ's stream plugin.
const DefaultStreamPort = 5552

// URLFromEnv returns IDEM_STREAM_URL when set; otherwise the stream URIs
// derived from IDEM_AMQP_URL's URLs (see StreamURLs), comma-separated;
// otherwise DefaultURL.
func URLFromEnv() string {
	if u := os.Getenv("IDEM_STREAM_URL"); u != "" {
		return u
	}
	if u := os.Getenv("IDEM_AMQP_URL"); u != "" {
		if s, err := StreamURLs(strings.Split(u, ",")); err == nil {
			return s
		}
	}
	return DefaultURL
}

// StreamURLs derives the stream protocol URI of each AMQP URL (see
// StreamURL) and returns them comma-separated, as Config.URI takes the
// nodes of a cluster.
func StreamURLs(amqpURLs []string) (string, error) {
	out := make([]string, len(amqpURLs))
	for i, u := range amqpURLs {
		s, err := StreamURL(strings.TrimSpace(u))
		if err != nil {
			return "", err
		}
		out[i] = s
	}
	return strings.Join(out, ","), nil
}

// StreamURL derives the stream protocol URI from an AMQP 0-9-1 URL: the
// credentials, host and vhost are kept, the scheme becomes rabbitmq-stream
// (rabbitmq-stream+tls for amqps) and the port DefaultStreamPort.
func StreamURL(amqpURL string) (string, error) {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return "", fmt.Errorf("streamio: parse amqp url %s: %w", Redact(amqpURL), redactErr(err))
	}
	switch u.Scheme {
	case "amqp":
		u.Scheme = "rabbitmq-stream"
	case "amqps":
		u.Scheme = "rabbitmq-stream+tls"
	default:
		return "", fmt.Errorf("streamio: amqp url %s: scheme must be amqp or amqps", Redact(amqpURL))
	}
	u.Host = net.JoinHostPort(u.Hostname(), strconv.Itoa(DefaultStreamPort))
	if u.Path == "" {
		u.Path = "/"
	}
	return u.String(), nil
}

// Redact returns uri, or a comma-separated list of them, with every
// password replaced by "xxxxx", for logs and errors.
func Redact(uri string) string { return amqpurl.Redact(uri) }

// redactErr drops the text of url.Error values, which quote the whole URL.
func redactErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

// Config configures Open.
type Config struct {
	// Logger receives the package's own logs and, unless RouteClientLogs
	// pinned another logger, the stream client's (which are process-wide:
	// they go to the Logger of the Env opened last). Default:
	// slog.Default().
	Logger *slog.Logger

	// PinHost makes every connection (consumers and producers) go to the
	// URI's host and port instead of the host the broker advertises for the
	// stream. Use it behind a load balancer or when the advertised name does
	// not resolve from here. It is always on when the URI's host is a
	// loopback address. It applies to a single URI only: the nodes of a list
	// are a cluster, whose members must be reachable where they advertise
	// themselves (stream.advertised_host and stream.advertised_port), since
	// the client connects a consumer or producer to the member it chose and
	// retries, without end, a connection that lands on another. Default:
	// false.
	PinHost bool

	// ProbeTimeout bounds how long Tail waits for the broker to deliver the
	// last chunk of a stream; a stream that delivers nothing within it is
	// empty. Default: 1s.
	ProbeTimeout time.Duration

	// URI is the stream protocol URI,
	// rabbitmq-stream://user:password@host:5552/vhost, or the URIs of a
	// cluster's nodes separated by commas: each call connects to the first
	// of them, in a shuffled order, that answers. Required; see URLFromEnv.
	URI string
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = time.Second
	}
	return c
}

// Env connects to RabbitMQ's stream protocol. Every call (Read, Follow,
// Tail, Publish, DeclareStream, DeleteStream) opens connections of its own
// and closes them when it returns: a slow reader never stalls another one's
// socket, and a call after a network failure starts from fresh connections
// instead of the client's stale ones (which it may take its RPC timeout to
// notice, or retry forever to replace). An Env is safe for concurrent use.
type Env struct {
	cfg        Config
	nodes      []string // Config.URI's URIs
	logger     *slog.Logger
	uri        string // redacted
	readBuffer int    // socket read buffer; 0 keeps kernel autotuning
	// stall is how long a subscription may wait without a record before it
	// checks that none is due (subscription.next). Default: stallCheck.
	stall time.Duration
	// subscribed, when set (by tests), sees each consumer right after the
	// client created it, before its close notification is registered.
	subscribed func(*stream.Consumer)

	mu     sync.Mutex
	live   map[*stream.Environment]struct{}
	closed bool
}

// ErrClosed is returned (wrapped) by calls on a closed Env.
var ErrClosed = errors.New("streamio: env closed")

// Open checks that the broker at cfg.URI accepts a connection and returns an
// Env for it. Credentials or a virtual host the broker refuses fail at this
// first dial with an error wrapping ErrAccessRefused, which retrying cannot
// fix. Connections keep the kernel's socket buffer autotuning: the
// client's default 8 KiB read buffer shrinks the TCP window below the
// broker's chunk size and slows consumption to a few hundred messages per
// second.
func Open(ctx context.Context, cfg Config) (*Env, error) {
	cfg = cfg.withDefaults()
	nodes, err := splitURIs(cfg.URI)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if _, err := environmentOptions(cfg, 0, n, len(nodes)); err != nil {
			return nil, err
		}
	}
	routeTo(cfg.Logger)
	e := &Env{cfg: cfg, nodes: nodes, logger: cfg.Logger, uri: Redact(cfg.URI), stall: stallCheck, live: map[*stream.Environment]struct{}{}}
	env, err := e.connect(ctx)
	if err != nil {
		return nil, err
	}
	e.disconnect(env)
	e.logger.Debug("streamio: broker reachable", slog.String("uri", e.uri))
	return e, nil
}

// splitURIs returns the URIs of Config.URI.
func splitURIs(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, errors.New("streamio: open: Config.URI is required")
	}
	var out []string
	for _, u := range strings.Split(list, ",") {
		if u = strings.TrimSpace(u); u == "" {
			return nil, fmt.Errorf("streamio: open %s: an empty URI in the list", Redact(list))
		}
		out = append(out, u)
	}
	return out, nil
}

// environmentOptions are the client's options for a connection to the node
// at uri, one of nodes URIs. When it is the only one and the address is
// pinned (see Config.PinHost), all its connections (locator, consumers,
// producers) go to it; the node of a list is the locator only, and
// consumers and producers go to the members the broker advertises.
func environmentOptions(cfg Config, readBuffer int, uri string, nodes int) (*stream.EnvironmentOptions, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("streamio: open %s: %w", Redact(uri), redactErr(err))
	}
	if u.Scheme != "rabbitmq-stream" && u.Scheme != "rabbitmq-stream+tls" {
		return nil, fmt.Errorf("streamio: open %s: scheme must be rabbitmq-stream or rabbitmq-stream+tls", Redact(uri))
	}
	opts := stream.NewEnvironmentOptions().
		SetUri(uri).
		// 0 keeps the kernel's receive buffer autotuning (see Open).
		SetReadBuffer(readBuffer).
		SetWriteBuffer(0).
		// One TCP connection per consumer and per producer.
		SetMaxConsumersPerClient(1).
		SetMaxProducersPerClient(1)
	if nodes == 1 && (cfg.PinHost || isLoopback(u.Hostname())) {
		port := DefaultStreamPort
		if p := u.Port(); p != "" {
			if port, err = strconv.Atoi(p); err != nil {
				return nil, fmt.Errorf("streamio: open %s: port: %w", Redact(uri), err)
			}
		}
		opts.SetAddressResolver(stream.AddressResolver{Host: u.Hostname(), Port: port})
	}
	return opts, nil
}

// connect opens a client environment (its locator connection) for one
// call, on the first node that answers, in a shuffled order. A refusal
// (ErrAccessRefused: users and vhosts belong to the whole cluster) ends the
// round at once. Close it with disconnect.
func (e *Env) connect(ctx context.Context) (*stream.Environment, error) {
	var fails []string
	var last error
	for _, uri := range amqpurl.Shuffled(e.nodes) {
		env, err := e.connectTo(ctx, uri)
		if err == nil {
			return env, nil
		}
		if ctx.Err() != nil || errors.Is(err, ErrAccessRefused) || errors.Is(err, ErrClosed) || len(e.nodes) == 1 {
			return nil, err
		}
		last = err
		fails = append(fails, err.Error())
	}
	return nil, fmt.Errorf("streamio: no node of %d answered: %s: %w", len(e.nodes), strings.Join(fails, "; "), last)
}

// connectTo opens a client environment on the node at uri.
func (e *Env) connectTo(ctx context.Context, uri string) (*stream.Environment, error) {
	opts, err := environmentOptions(e.cfg, e.readBuffer, uri, len(e.nodes))
	if err != nil {
		return nil, err
	}
	type result struct {
		env *stream.Environment
		err error
	}
	// NewEnvironment takes no context; it gives up on its own after the
	// client's RPC timeout.
	done := make(chan result, 1)
	go func() {
		env, err := stream.NewEnvironment(opts)
		done <- result{env, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		go func() {
			if r := <-done; r.env != nil {
				_ = r.env.Close()
			}
		}()
		return nil, fmt.Errorf("streamio: connect %s: %w", Redact(uri), ctx.Err())
	}
	if r.err != nil {
		if r.env != nil {
			_ = r.env.Close()
		}
		return nil, fmt.Errorf("streamio: connect %s: %w", Redact(uri), refused(scrub(r.err, uri)))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		_ = r.env.Close()
		return nil, ErrClosed
	}
	e.live[r.env] = struct{}{}
	return r.env, nil
}

// ErrAccessRefused is returned (wrapped) when the broker refuses the
// connection's user, password or virtual host: a configuration error that
// retrying cannot fix.
var ErrAccessRefused = errors.New("streamio: access refused")

// refused explains the client's access errors and marks them with
// ErrAccessRefused; other errors are returned as they are.
func refused(err error) error {
	var why string
	switch {
	case errors.Is(err, stream.AuthenticationFailure):
		why = "authentication failed: check the user name and password"
	case errors.Is(err, stream.AuthenticationFailureLoopbackError):
		why = "this user may connect from localhost only (the broker's loopback_users)"
	case errors.Is(err, stream.VirtualHostAccessFailure):
		why = "the virtual host does not exist or the user has no access to it"
	case errors.Is(err, stream.CodeAccessRefused):
		why = "the user lacks the permissions"
	default:
		return err
	}
	return fmt.Errorf("%w: %s (%w)", ErrAccessRefused, why, err)
}

// disconnect closes env unless Close already did: a client environment
// must be closed once.
func (e *Env) disconnect(env *stream.Environment) {
	e.mu.Lock()
	_, mine := e.live[env]
	delete(e.live, env)
	e.mu.Unlock()
	if mine {
		e.closeWithin(env, closeTimeout)
	}
}

// closeTimeout bounds the wait for the client to close an environment. Its
// Close takes the lock of the environment's producers or consumers, which a
// client call that a context left behind may still hold (a producer being
// created retries its connection until the broker's metadata settles):
// past the bound, the caller goes on, and the goroutine closing it ends
// when the client's Close returns, if ever; the warning says so.
const closeTimeout = 5 * time.Second

// closeWithin closes env, waiting for it at most d.
func (e *Env) closeWithin(env *stream.Environment, d time.Duration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = env.Close()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		e.logger.Warn("streamio: a client environment did not close in time; its close goes on in the background",
			slog.String("uri", e.uri), slog.Duration("waited", d))
	}
}

// scrub replaces the URI's password in err's text, in case the client quoted
// the URI.
func scrub(err error, uri string) error {
	u, perr := url.Parse(uri)
	if perr != nil || err == nil {
		return err
	}
	pw, ok := u.User.Password()
	if !ok || pw == "" || !strings.Contains(err.Error(), pw) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Close closes every connection the Env's calls hold: running Reads and
// Follows return an error wrapping ErrConnectionLost, later calls ErrClosed.
// It waits for each at most closeTimeout: a connection whose client does
// not close in time is logged and may outlive Close.
func (e *Env) Close() error {
	e.mu.Lock()
	e.closed = true
	live := e.live
	e.live = nil
	e.mu.Unlock()
	var wg sync.WaitGroup
	for env := range live {
		wg.Go(func() { e.closeWithin(env, closeTimeout) })
	}
	wg.Wait()
	return nil
}

// StreamOptions are the retention settings of a new stream. Zero values leave
// the broker's defaults.
type StreamOptions struct {
	// MaxAge removes segments older than this.
	MaxAge time.Duration
	// MaxLengthBytes caps the stream's size on disk, whole segments are
	// removed first.
	MaxLengthBytes int64
	// MaxSegmentSizeBytes is the size of one segment file.
	MaxSegmentSizeBytes int64
}

// DeclareStream creates the stream name if it does not exist. Declaring an
// existing stream with the same options is not an error.
func (e *Env) DeclareStream(ctx context.Context, name string, opts StreamOptions) error {
	so := &stream.StreamOptions{MaxAge: opts.MaxAge}
	if opts.MaxLengthBytes > 0 {
		so.MaxLengthBytes = stream.ByteCapacity{}.B(opts.MaxLengthBytes)
	}
	if opts.MaxSegmentSizeBytes > 0 {
		so.MaxSegmentSizeBytes = stream.ByteCapacity{}.B(opts.MaxSegmentSizeBytes)
	}
	env, err := e.connect(ctx)
	if err != nil {
		return fmt.Errorf("streamio: declare stream %s: %w", name, err)
	}
	defer e.disconnect(env)
	if err := call(ctx, func() error { return env.DeclareStream(name, so) }); err != nil {
		return fmt.Errorf("streamio: declare stream %s: %w", name, err)
	}
	return nil
}

// DeleteStream deletes the stream name and its data. Deleting a stream that
// does not exist returns an error wrapping ErrStreamNotFound.
func (e *Env) DeleteStream(ctx context.Context, name string) error {
	env, err := e.connect(ctx)
	if err != nil {
		return fmt.Errorf("streamio: delete stream %s: %w", name, err)
	}
	defer e.disconnect(env)
	if err := call(ctx, func() error { return env.DeleteStream(name) }); err != nil {
		return fmt.Errorf("streamio: delete stream %s: %w", name, err)
	}
	return nil
}

// ErrStreamNotFound is returned (wrapped) for a stream that does not exist.
var ErrStreamNotFound = stream.StreamDoesNotExist

// ErrStreamMismatch is returned (wrapped) by DeclareStream when a queue of
// that name exists with other arguments: a stream with other retention
// settings, or a queue of another type.
var ErrStreamMismatch = stream.PreconditionFailed

// StreamExists reports whether the stream name exists. A queue of another
// type by that name is not a stream. Only the broker's answer that the
// stream does not exist makes it false; a failed or unclear answer (a
// metadata call that failed, a leader being elected) is an error, never a
// false that a caller would take for a missing stream.
func (e *Env) StreamExists(ctx context.Context, name string) (bool, error) {
	env, err := e.connect(ctx)
	if err != nil {
		return false, fmt.Errorf("streamio: stream %s exists: %w", name, err)
	}
	defer e.disconnect(env)
	err = call(ctx, func() error { _, err := env.StreamMetaData(name); return err })
	switch {
	case err == nil, errors.Is(err, stream.LeaderNotReady):
		return true, nil
	case errors.Is(err, stream.StreamDoesNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("streamio: stream %s exists: %w", name, err)
	}
}

// call runs a client call that takes no context and returns when it is done
// or ctx ends, whichever is first. The client's own RPC timeout bounds the
// call left behind.
func call(ctx context.Context, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
