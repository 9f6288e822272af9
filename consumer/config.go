package consumer

import (
	"log/slog"
	"os"
	"runtime"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/streamio"
)

// Topology says what the consumer does with its queues at start.
type Topology int

const (
	// Declare declares the queue, the retry queue and the dead-letter queue
	// (idempotently). It is the default.
	Declare Topology = iota
	// Passive checks that the three queues exist and fails otherwise.
	Passive
	// Existing uses the queues as they are, without checking.
	Existing
)

// Config configures a Consumer. Only AMQPURL (or a stream source), Name, Pool
// and Queue are required; every other field has the default its comment states.
type Config struct {
	// AMQPURL is the broker URL, e.g. amqp://guest:guest@127.0.0.1:5672/.
	AMQPURL string

	// BatchMaxSize is the largest number of messages run in one transaction.
	// Default: 200.
	BatchMaxSize int

	// BatchMaxWait is how long a worker that already holds more than one
	// message waits for the batch to fill. A lone message never waits.
	// Default: 500µs.
	BatchMaxWait time.Duration

	// BatchRetries is how many times a batch is retried after a database
	// failure (connection lost, commit failed, deadlock, serialization
	// failure) before its messages are handed back to the broker. Default: 8.
	BatchRetries int

	// BusinessKey, when set, derives Message.BusinessKey (stored in the inbox).
	// An error dead-letters the message with reason "invalid_business_key".
	// Like Hash and MessageID, it may be called from several goroutines at
	// once (large stream and replay batches are prepared in parallel).
	BusinessKey func(m *Message) (string, error)

	// CommitTimeout bounds commit and ack, which run on a context detached
	// from Run's cancellation. Default: 10s.
	CommitTimeout time.Duration

	// ConnectionName is shown in the broker's management UI. Default: "idem:"+Name.
	ConnectionName string

	// DeadLetterQueue receives messages that cannot be processed. Default: Queue+".dlq".
	DeadLetterQueue string

	// DeliveryLimit is the quorum queue's x-delivery-limit: a message the
	// broker delivered this many times without an ack or a decision (a worker
	// that crashes on it, say) is dead-lettered by the broker with x-death
	// reason "delivery_limit". Default: 20.
	DeliveryLimit int

	// Hash computes the payload hash. Default: HashRaw (SHA-256 of the body).
	Hash HashFunc

	// Logger receives the runtime's logs. Default: slog.Default().
	Logger *slog.Logger

	// MaxAttempts is how many times a message is tried before it is
	// dead-lettered with reason "max_attempts". Default: 5.
	MaxAttempts int

	// MaxHeaders is the largest number of headers a message may carry;
	// more are dead-lettered with reason "too_many_headers". Default: 256.
	MaxHeaders int

	// MaxIDBytes is the longest accepted message id. Default: 512.
	MaxIDBytes int

	// MaxMessageBytes is the largest accepted body; larger ones are
	// dead-lettered with reason "message_too_large". Default: 16 MiB.
	MaxMessageBytes int

	// MessageID extracts the message identity. Default: IDFromProperty.
	MessageID IDFunc

	// MeterProvider provides the metrics. Default: the global provider.
	MeterProvider metric.MeterProvider

	// Name scopes the inbox: two consumers with different names process the
	// same message independently. Required.
	Name string

	// OrderingKey, when set, keeps messages with the same key in order
	// (one worker per key) while different keys run in parallel.
	OrderingKey func(m *Message) string

	// Pool is the PostgreSQL pool. Required.
	Pool *pgxpool.Pool

	// Prefetch is the broker's limit of unacknowledged deliveries.
	// Default: 2 × BatchMaxSize × Workers, at most 1000.
	Prefetch int

	// Queue is the queue to consume. Required.
	Queue string

	// QueueType is the x-queue-type the queue is declared with. Default: "quorum".
	QueueType string

	// ReconnectMaxDelay caps the exponential backoff between reconnects. Default: 30s.
	ReconnectMaxDelay time.Duration

	// RetryBaseDelay is the delay before the first retry of a failed message;
	// it doubles with each attempt, with jitter. Default: 1s.
	RetryBaseDelay time.Duration

	// RetryMaxDelay caps the retry delay. Default: 5m.
	RetryMaxDelay time.Duration

	// RetryQueue holds messages waiting for their retry. Default: Queue+".retry".
	RetryQueue string

	// ShutdownTimeout is how long in-flight batches may take to finish after
	// Run's context is cancelled. Default: 30s.
	ShutdownTimeout time.Duration

	// StorePayloads keeps dead-lettered payloads in the dead_letters table.
	// Default: false (only hashes are stored; the payload is in the DLQ).
	StorePayloads bool

	// Stream is the RabbitMQ stream to consume instead of a Queue: in order,
	// with the checkpoint in each batch's transaction, one active reader per
	// (Name, Stream) across processes.
	Stream string

	// StreamURL is the stream protocol URL. Default: derived from AMQPURL
	// (rabbitmq-stream://…:5552/), or IDEM_STREAM_URL.
	StreamURL string

	// Tables names the schema and table prefix. Default: public, idem_.
	Tables idem.Tables

	// Topology says whether queues are declared, checked, or taken as they are.
	// Default: Declare.
	Topology Topology

	// TracerProvider provides the spans. Default: the global provider.
	TracerProvider trace.TracerProvider

	// Workers is the number of batches processed in parallel. Default: the
	// number of CPUs (GOMAXPROCS), at least 2. The runtime is CPU-bound
	// once batches are large: more workers than cores split the same flow
	// into smaller batches that cost more per message. Raise it when
	// handlers wait on slow round trips (a distant database).
	Workers int
}

func (c *Config) setDefaults() {
	if c.BatchMaxSize <= 0 {
		c.BatchMaxSize = 200
	}
	if c.BatchMaxWait == 0 {
		c.BatchMaxWait = 500 * time.Microsecond
	}
	if c.BatchRetries <= 0 {
		c.BatchRetries = 8
	}
	if c.CommitTimeout <= 0 {
		c.CommitTimeout = 10 * time.Second
	}
	if c.ConnectionName == "" {
		c.ConnectionName = "idem:" + c.Name
	}
	if c.DeadLetterQueue == "" && c.Queue != "" {
		c.DeadLetterQueue = c.Queue + ".dlq"
	}
	if c.DeliveryLimit <= 0 {
		c.DeliveryLimit = 20
	}
	if c.Hash == nil {
		c.Hash = HashRaw
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.MaxHeaders <= 0 {
		c.MaxHeaders = 256
	}
	if c.MaxIDBytes <= 0 {
		c.MaxIDBytes = 512
	}
	if c.MaxMessageBytes <= 0 {
		c.MaxMessageBytes = 16 << 20
	}
	if c.MessageID == nil {
		c.MessageID = IDFromProperty
	}
	if c.Workers <= 0 {
		c.Workers = max(runtime.GOMAXPROCS(0), 2)
	}
	if c.Prefetch <= 0 {
		c.Prefetch = min(2*c.BatchMaxSize*c.Workers, 1000)
	}
	if c.QueueType == "" {
		c.QueueType = "quorum"
	}
	if c.ReconnectMaxDelay <= 0 {
		c.ReconnectMaxDelay = 30 * time.Second
	}
	if c.RetryBaseDelay <= 0 {
		c.RetryBaseDelay = time.Second
	}
	if c.RetryMaxDelay <= 0 {
		c.RetryMaxDelay = 5 * time.Minute
	}
	if c.RetryQueue == "" && c.Queue != "" {
		c.RetryQueue = c.Queue + ".retry"
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.StreamURL == "" && c.Stream != "" {
		if os.Getenv("IDEM_STREAM_URL") != "" || c.AMQPURL == "" {
			c.StreamURL = streamio.URLFromEnv()
		} else if u, err := streamio.StreamURL(c.AMQPURL); err == nil {
			c.StreamURL = u
		}
	}
	c.Tables = c.Tables.WithDefaults()
}

// validate checks the fields every source needs.
func (c *Config) validate() error {
	switch {
	case c.Name == "":
		return configError("Name is required")
	case c.Pool == nil:
		return configError("Pool is required")
	case c.BatchMaxWait < 0:
		return configError("BatchMaxWait must not be negative")
	}
	return c.Tables.Validate()
}
