package consumer

import (
	"cmp"
	"crypto/tls"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/amqpnames"
	"github.com/idemkit/idem/internal/amqpurl"
	"github.com/idemkit/idem/internal/engine"
	"github.com/idemkit/idem/internal/streamio"
)

// Topology says what the consumer does with its queues, or its stream, at
// start.
type Topology int

const (
	// Declare declares the queue, the retry queue and the dead-letter queue
	// (idempotently), or the stream. It is the default.
	Declare Topology = iota
	// Passive checks that the three queues, or the stream, exist and fails
	// otherwise.
	Passive
	// Existing uses the queues, or the stream, as they are, without
	// checking.
	Existing
)

// Config configures a Consumer. Name and Pool are required; a Queue needs
// its broker (AMQPURL or AMQPURLs), which New checks, and Run needs a Queue
// or a Stream; every other field has the default its comment states. A
// consumer of a Stream leaves the fields whose comment says "queue only"
// unset (New refuses them), and a consumer of a Queue those that say
// "stream only".
type Config struct {
	// AMQPURL is the broker's URL when it is one node, e.g.
	// amqp://guest:guest@127.0.0.1:5672/. Set it or AMQPURLs, not both. New
	// refuses a malformed URL, and one that holds several (see AMQPURLs).
	AMQPURL string

	// AMQPURLs are the nodes of a RabbitMQ cluster, one URL each. Each
	// session dials them in a shuffled order and keeps the first that
	// answers; when a node goes, the session ends and the next one dials the
	// others, the reconnect backoff running between rounds of the whole
	// list. Credentials refused, or a vhost that does not exist, end Run
	// within the first round. Every URL is logged with its password hidden.
	AMQPURLs []string

	// BatchMaxSize is the largest number of messages run in one transaction.
	// Default: 200.
	BatchMaxSize int

	// BatchMaxWait is how long a worker that already holds more than one
	// message waits for the batch to fill. A lone message never waits.
	// Default: 500µs. Queue only.
	BatchMaxWait time.Duration

	// BatchRetries is how many times a batch is retried after a database
	// failure (connection lost, commit failed) before its messages are
	// handed back to the broker. Conflicts between concurrent batches
	// (deadlock, serialization failure, lock timeout) split the batch at
	// once instead. Default: 8.
	BatchRetries int

	// BusinessKey, when set, derives Message.BusinessKey (stored in the inbox).
	// An error dead-letters the message with reason "invalid_business_key".
	// Without an OrderingKey it also schedules: messages with one business
	// key go to one worker (no order is promised), so that the batches of
	// different workers rarely write the same rows.
	// Like Hash and MessageID, it may be called from several goroutines at
	// once (large stream and replay batches are prepared in parallel).
	BusinessKey func(m *Message) (string, error)

	// CommitTimeout bounds commit and ack, which run on a context detached
	// from Run's cancellation. Default: 10s.
	CommitTimeout time.Duration

	// ConnectionName is shown in the broker's management UI. Default: "idem:"+Name.
	// Queue only.
	ConnectionName string

	// DeadLetterQueue receives messages that cannot be processed. Default:
	// deadletters.QueueName(Queue), the queue's name and .dlq. Queue only.
	DeadLetterQueue string

	// DeliveryLimit is the quorum queue's x-delivery-limit: a message the
	// broker delivered this many times without an ack (a worker that keeps
	// dying on it) is dead-lettered by the broker with x-death reason
	// "delivery_limit". idem dead-letters such a message itself first (see
	// MaxCrashes); the limit is the backstop. It must exceed MaxCrashes + 1.
	// Default: 20. Queue only.
	DeliveryLimit int

	// HandlerTimeout bounds each handler call. A handler past it has its
	// context cancelled (its statements are cancelled with it), its batch
	// rolls back, and its message counts a failed attempt — retried, then
	// dead-lettered with reason "handler_timeout" — while the batch's other
	// messages run again without it. A handler that ignores its context for
	// 2s more is abandoned: its connection is closed and its backend
	// terminated, its goroutine is left to finish on its own (counted in
	// Stats.AbandonedHandlers and logged at Error), and the worker goes on.
	// Default: 30s.
	HandlerTimeout time.Duration

	// Hash computes the payload hash. Default: SHA-256 of the raw body;
	// HashCanonicalJSON opts into canonical JSON.
	Hash HashFunc

	// LockTimeout is the lock_timeout of a batch transaction: a batch that
	// waits longer for a row lock (another batch, in this process or
	// another, holds it) is rolled back and retried at once with a longer
	// wait, then split, so that a conflict costs milliseconds instead of
	// PostgreSQL's deadlock_timeout. Default: 50ms.
	LockTimeout time.Duration

	// Logger receives the runtime's logs. Default: slog.Default().
	Logger *slog.Logger

	// MaxAttempts is how many times a message is tried before it is
	// dead-lettered with reason "max_attempts". Default: 5.
	MaxAttempts int

	// MaxBufferedBytes bounds the bodies of the deliveries held in memory —
	// prefetched, buffered and in flight — whatever the message size: past
	// it the runtime stops reading from the broker until batches settle.
	// One message larger than the bound still passes on its own.
	// Default: 64 MiB. Queue only.
	MaxBufferedBytes int64

	// MaxCrashes is how many times a message may be running, alone, when
	// its worker process dies before idem dead-letters it with reason
	// "worker_crashed". Redelivered messages run alone, so a message that
	// kills the process takes only itself down. Default: 3.
	MaxCrashes int

	// MaxHeaders is the largest number of headers a message may carry;
	// more are dead-lettered with reason "too_many_headers". Default: 256.
	MaxHeaders int

	// MaxIDBytes is the longest accepted message id. Default: 512.
	MaxIDBytes int

	// MaxMessageBytes is the largest accepted body; larger ones are
	// dead-lettered with reason "message_too_large". Default: 16 MiB.
	MaxMessageBytes int

	// MessageID extracts the message identity. Default: the AMQP message-id
	// property.
	MessageID IDFunc

	// MeterProvider provides the metrics. Default: the global provider.
	MeterProvider metric.MeterProvider

	// Name scopes the inbox: two consumers with different names process the
	// same message independently. Required.
	Name string

	// OrderingKey, when set, keeps messages with the same key in order
	// (one worker per key) while different keys run in parallel, within one
	// process (Partitions keeps it across processes). A message whose
	// handler fails holds its key: it is not copied to the retry queue but
	// stays unacked in its worker, retried after its backoff
	// (RetryBaseDelay, RetryMaxDelay) with its key's later messages waiting
	// behind it, while other keys flow; its attempts are counted in the
	// database, so MaxAttempts holds across restarts, and a crash or a
	// shutdown hands the held messages back to the head of the queue, in
	// order. Once it is dead-lettered its key moves on without it (counted
	// in Stats.OrderGaps). What a key holds counts against Prefetch and
	// MaxBufferedBytes. Queue only.
	OrderingKey func(m *Message) string

	// Partitions, when above 0, keeps OrderingKey's order across worker
	// processes: Queue names an exchange of type x-consistent-hash (the
	// rabbitmq_consistent_hash_exchange plugin) in front of Partitions
	// queues, Queue.p0 … Queue.pN-1 (package partitions), each with a
	// single active consumer and a retry queue of its own. The processes
	// running this consumer spread the partitions between them (PostgreSQL
	// advisory locks; with 3 processes and 8 partitions, 2 or 3 each) and
	// take over those of a process that dies or leaves; one that joins gets
	// its share. Publishers send to the exchange with the ordering key as
	// routing key (partitions.Route); without an OrderingKey, the routing
	// key is the ordering key. The partitions are quorum queues: New refuses
	// another QueueType. A failing message holds its key as with an
	// OrderingKey, whichever process runs it: its attempts are counted in
	// the database, and a process that dies during its backoff leaves it,
	// and its key's later messages, at the head of the partition queue for
	// the next holder. Fixed for the life of the queues. Default: 0, one
	// queue. Queue only.
	Partitions int

	// Pool is the PostgreSQL pool. Required.
	Pool *pgxpool.Pool

	// Prefetch is the broker's limit of unacknowledged deliveries.
	// Default: 4 × BatchMaxSize × Workers, at most 4000: a batch running
	// and one ready for every worker, and as many acks again waiting for
	// a multiple ack. MaxBufferedBytes bounds the bytes they hold. Queue only.
	Prefetch int

	// Queue is the queue to consume. Queue only.
	Queue string

	// QueueType is the x-queue-type the queue is declared with. Default: "quorum".
	// Queue only.
	QueueType string

	// ReconnectMaxDelay caps the exponential backoff between reconnects
	// (a queue's broker sessions, a stream reader's restarts). The backoff
	// starts again from its first delay after a session that worked: one
	// that settled messages, or lasted a minute. Default: 30s.
	ReconnectMaxDelay time.Duration

	// RetryBaseDelay is the delay before the first retry of a failed message;
	// it doubles with each attempt, with jitter. Default: 1s.
	RetryBaseDelay time.Duration

	// RetryMaxDelay caps the retry delay. Default: 5m.
	RetryMaxDelay time.Duration

	// RetryQueue holds messages waiting for their retry, but for a consumer
	// with an OrderingKey or Partitions, which retries in place. Default:
	// the queue's name and .retry. Queue only.
	RetryQueue string

	// ShutdownTimeout is how long in-flight batches may take to finish after
	// Run's context is cancelled. Default: 30s.
	ShutdownTimeout time.Duration

	// StorePayloads keeps dead-lettered payloads in the dead_letters table.
	// Default: false (only hashes are stored; the payload is in the DLQ).
	StorePayloads bool

	// Stream is the RabbitMQ stream to read instead of a queue: in order,
	// with the stream offset checkpointed in each batch's transaction, and
	// one active reader per (Name, Stream) across processes (see Streams in
	// the package documentation). Set Queue or Stream, not both. With
	// Topology Declare, the consumer declares it through AMQP 0-9-1, which
	// needs AMQPURL or AMQPURLs. Stream only.
	Stream string

	// StreamURL is the stream protocol URL, or the URLs of a cluster's
	// nodes separated by commas: each connection goes to the first of them,
	// in a shuffled order, that answers. Default: IDEM_STREAM_URL, else
	// derived from AMQPURL or AMQPURLs (same credentials, hosts and vhost,
	// port 5552), else rabbitmq-stream://guest:guest@127.0.0.1:5552/.
	// Stream only.
	StreamURL string

	// Tables names the schema and table prefix. Default: public, idem_.
	Tables idem.Tables

	// TLSConfig is the TLS configuration of the connections to an amqps://
	// URL. Default: the one the URL's query describes (cacertfile, certfile
	// and keyfile, server_name_indication), else the system's certificate
	// authorities; the server name is the URL's host unless set. The
	// consumer makes the TLS connection itself and reads the AMQP frames
	// from it, so a message the client cannot decode is dead-lettered over
	// TLS as over TCP (see deadletters.ReasonUndecodable). New refuses it
	// when no broker URL is amqps://. Queue only.
	TLSConfig *tls.Config

	// Topology says whether the queues, or the stream, are declared,
	// checked, or taken as they are. Default: Declare.
	Topology Topology

	// TracerProvider provides the spans. Default: the global provider.
	TracerProvider trace.TracerProvider

	// Workers is the number of batches processed in parallel. Default:
	// twice the number of CPUs (GOMAXPROCS), at least 4, at most the Pool's
	// MaxConns: a handler's statements are round trips, and while one batch
	// waits for PostgreSQL another uses the CPU. Fewer run at once while
	// batches conflict over rows, and more again as soon as they stop.
	Workers int
}

// Defaults of the fields that are not zero by default.
const (
	defaultHandlerTimeout   = 30 * time.Second
	defaultLockTimeout      = 50 * time.Millisecond
	defaultMaxBufferedBytes = 64 << 20
	// maxPartitions bounds Config.Partitions: each is two quorum queues.
	maxPartitions = 1024
)

func (c *Config) setDefaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.BatchMaxSize, 200)
	def(&c.BatchRetries, 8)
	defDur(&c.CommitTimeout, 10*time.Second)
	defDur(&c.HandlerTimeout, defaultHandlerTimeout)
	defDur(&c.LockTimeout, defaultLockTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	def(&c.MaxAttempts, 5)
	def(&c.MaxCrashes, 3)
	def(&c.MaxHeaders, 256)
	def(&c.MaxIDBytes, 512)
	def(&c.MaxMessageBytes, 16<<20)
	if c.Workers <= 0 {
		c.Workers = max(2*runtime.GOMAXPROCS(0), 4)
		if c.Pool != nil { // a worker without a connection only waits for one
			c.Workers = min(c.Workers, max(int(c.Pool.Config().MaxConns), 2))
		}
	}
	defDur(&c.ReconnectMaxDelay, 30*time.Second)
	defDur(&c.RetryBaseDelay, time.Second)
	defDur(&c.RetryMaxDelay, 5*time.Minute)
	defDur(&c.ShutdownTimeout, 30*time.Second)
	c.Tables = c.Tables.WithDefaults()
	if c.Queue != "" {
		c.setQueueDefaults()
	}
	if c.Stream != "" && c.StreamURL == "" {
		c.StreamURL = defaultStreamURL(c.nodes())
	}
}

// defaultStreamURL is StreamURL's default: IDEM_STREAM_URL, else the
// stream protocol URLs of the broker's nodes, else the local broker's.
// Nodes that are malformed (validate refuses them) give "".
func defaultStreamURL(nodes []string) string {
	if os.Getenv("IDEM_STREAM_URL") != "" || len(nodes) == 0 {
		return streamio.URLFromEnv()
	}
	url, err := streamio.StreamURLs(nodes)
	if err != nil {
		return ""
	}
	return url
}

// setQueueDefaults fills in the fields only a queue reads. A consumer
// without a Queue keeps them as they were set, so that New can refuse the
// ones set by mistake (see queueOnly).
func (c *Config) setQueueDefaults() {
	if c.BatchMaxWait == 0 {
		c.BatchMaxWait = 500 * time.Microsecond
	}
	if c.ConnectionName == "" {
		c.ConnectionName = "idem:" + c.Name
	}
	if c.DeadLetterQueue == "" {
		c.DeadLetterQueue = amqpnames.DeadLetterQueue(c.Queue)
	}
	if c.DeliveryLimit <= 0 {
		c.DeliveryLimit = 20
	}
	if c.MaxBufferedBytes <= 0 {
		c.MaxBufferedBytes = defaultMaxBufferedBytes
	}
	if c.Prefetch <= 0 {
		c.Prefetch = min(4*c.BatchMaxSize*c.Workers, 4000)
	}
	if c.QueueType == "" {
		c.QueueType = "quorum"
	}
	if c.RetryQueue == "" {
		c.RetryQueue = amqpnames.RetryQueue(c.Queue)
	}
}

// queueOnly names the fields of c that only a queue consumer reads and
// that are set: a consumer of another source (a stream) refuses them.
func (c *Config) queueOnly() []string {
	var set []string
	for name, isSet := range map[string]bool{
		"BatchMaxWait": c.BatchMaxWait != 0, "ConnectionName": c.ConnectionName != "",
		"DeadLetterQueue": c.DeadLetterQueue != "", "DeliveryLimit": c.DeliveryLimit != 0,
		"MaxBufferedBytes": c.MaxBufferedBytes != 0, "OrderingKey": c.OrderingKey != nil, "Partitions": c.Partitions != 0,
		"Prefetch": c.Prefetch != 0, "Queue": c.Queue != "", "QueueType": c.QueueType != "",
		"RetryQueue": c.RetryQueue != "", "TLSConfig": c.TLSConfig != nil,
	} {
		if isSet {
			set = append(set, name)
		}
	}
	slices.Sort(set)
	return set
}

// isAMQPS reports whether rawURL's scheme is amqps.
func isAMQPS(rawURL string) bool {
	return len(rawURL) > 8 && strings.EqualFold(rawURL[:8], "amqps://")
}

// validate checks the fields every source needs.
func (c *Config) validate() error {
	if c.AMQPURL != "" || len(c.AMQPURLs) > 0 {
		if _, err := amqpurl.Nodes(c.AMQPURL, c.AMQPURLs); err != nil {
			return configError("%v", err)
		}
	}
	switch {
	case c.Name == "":
		return configError("Name is required")
	case c.Pool == nil:
		return configError("Pool is required")
	case c.BatchMaxWait < 0:
		return configError("BatchMaxWait must not be negative")
	case c.Partitions < 0 || c.Partitions > maxPartitions:
		return configError("Partitions must be between 0 and %d", maxPartitions)
	case c.Queue != "" && c.AMQPURL == "" && len(c.AMQPURLs) == 0:
		return configError("Queue needs AMQPURL or AMQPURLs: the broker to consume it from")
	case c.Partitions > 0 && c.Queue == "":
		return configError("Partitions needs a Queue")
	case c.Partitions > 0 && c.QueueType != "quorum":
		return configError("Partitions needs quorum queues (QueueType %q): a partition must outlive any one node, and its single active consumer is the fence", c.QueueType)
	case c.Queue != "" && c.Stream != "":
		return configError("set Queue or Stream, not both: a consumer reads one source")
	case c.Stream != "" && len(c.queueOnly()) > 0:
		return configError("a stream consumer reads no queue; leave %s unset (queue only)", strings.Join(c.queueOnly(), ", "))
	case c.Queue == "" && len(c.queueOnly()) > 0:
		return configError("%s only configure a queue consumer, and Queue is not set", strings.Join(c.queueOnly(), ", "))
	case c.TLSConfig != nil && !slices.ContainsFunc(append([]string{c.AMQPURL}, c.AMQPURLs...), isAMQPS):
		return configError("TLSConfig is set and no broker URL is amqps://: it would not be used")
	case c.Stream == "" && c.StreamURL != "":
		return configError("StreamURL only configures a stream consumer, and Stream is not set")
	case c.Stream != "" && c.Topology == Declare && c.AMQPURL == "" && len(c.AMQPURLs) == 0:
		return configError("a stream consumer declares its stream through AMQP 0-9-1 (Topology Declare, the default): " +
			"set AMQPURL or AMQPURLs, or set Topology to Passive or Existing")
	case c.Partitions > 0 && c.RetryQueue != amqpnames.RetryQueue(c.Queue):
		return configError("RetryQueue cannot be set with Partitions: each partition has its own (Queue.pI.retry)")
	case c.Queue != "" && c.QueueType == "quorum" && c.DeliveryLimit <= c.MaxCrashes+1:
		return configError("DeliveryLimit (%d) must exceed MaxCrashes + 1 (%d): idem must dead-letter a poison message before the broker does",
			c.DeliveryLimit, c.MaxCrashes+1)
	}
	return c.Tables.Validate()
}

// nodes are the broker's URLs, AMQPURL or AMQPURLs (validate checked them),
// or none.
func (c *Config) nodes() []string {
	nodes, _ := amqpurl.Nodes(c.AMQPURL, c.AMQPURLs)
	return nodes
}

// orderingKey is OrderingKey; with Partitions and no OrderingKey, the
// routing key the message was published with, which chose its partition.
func (c *Config) orderingKey() func(*Message) string {
	if c.OrderingKey == nil && c.Partitions > 0 {
		return func(m *Message) string { return m.RoutingKey }
	}
	return c.OrderingKey
}

// affinityKey schedules by business key when there is no ordering key:
// messages of one key go to one worker, whose batches then rarely meet
// another worker's rows.
func (c *Config) affinityKey() func(*Message) string {
	if c.OrderingKey != nil || c.BusinessKey == nil {
		return nil
	}
	return func(m *Message) string { return m.BusinessKey }
}

// engineConfig is the engine's part of the configuration: its source is
// the Queue, the Stream, or (for Process alone) the Name.
func (c *Config) engineConfig() engine.Config {
	source := cmp.Or(c.Queue, c.Stream, c.Name)
	return engine.Config{
		Name: c.Name, Source: source, Pool: c.Pool, Tables: c.Tables, Logger: c.Logger.With("consumer", c.Name),
		MeterProvider: c.MeterProvider, TracerProvider: c.TracerProvider,
		Hash: c.Hash, MessageID: c.MessageID, BusinessKey: c.BusinessKey,
		MaxMessageBytes: c.MaxMessageBytes, MaxHeaders: c.MaxHeaders, MaxIDBytes: c.MaxIDBytes,
		BatchRetries: c.BatchRetries, MaxAttempts: c.MaxAttempts, MaxCrashes: c.MaxCrashes,
		CommitTimeout: c.CommitTimeout, HandlerTimeout: c.HandlerTimeout, LockTimeout: c.LockTimeout,
		MaxConcurrency: c.Workers, StorePayloads: c.StorePayloads,
	}
}
