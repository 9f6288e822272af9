package consumer

import (
	"crypto/tls"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testdb"
	"github.com/idemkit/idem/internal/testkit/testrun"
)

// One consumer reads one source, and a field that configures the other
// source is a mistake New refuses, naming it.
func TestNewRefusesFieldsOfTheOtherSource(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"queue and stream", Config{Queue: "q", Stream: "s", AMQPURL: "amqp://127.0.0.1/"}, "set Queue or Stream, not both"},
		{"queue-only fields", Config{Stream: "s", Prefetch: 10, OrderingKey: func(m *Message) string { return m.ID }},
			"leave OrderingKey, Prefetch unset (queue only)"},
		{"a TLS configuration for a stream", Config{Stream: "s", AMQPURL: "amqps://127.0.0.1/", TLSConfig: &tls.Config{}},
			"leave TLSConfig unset (queue only)"},
		{"a TLS configuration without amqps", Config{Queue: "q", AMQPURL: "amqp://127.0.0.1/", TLSConfig: &tls.Config{}},
			"TLSConfig is set and no broker URL is amqps://"},
		{"a stream to declare without a broker", Config{Stream: "s"}, "set AMQPURL or AMQPURLs, or set Topology to Passive"},
		{"stream URL without a stream", Config{Queue: "q", AMQPURL: "amqp://127.0.0.1/", StreamURL: "rabbitmq-stream://127.0.0.1:5552/"},
			"StreamURL only configures a stream consumer"},
	} {
		tc.cfg.Name, tc.cfg.Pool, tc.cfg.Logger = "test", pool, testrun.Logger()
		_, err := New(tc.cfg)
		require.ErrorIs(t, err, ErrConfig, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	_, err := New(Config{Name: "test", Pool: pool, Stream: "s", Topology: Passive})
	require.NoError(t, err, "a stream consumer takes a Topology")
}

// Without IDEM_STREAM_URL, a stream consumer reads from the stream port of
// the broker's nodes, with their credentials and vhost.
func TestStreamURLDefaultsToTheStreamPortsOfTheNodes(t *testing.T) {
	t.Setenv("IDEM_STREAM_URL", "")
	c, err := New(Config{Name: "test", Pool: testdb.Pool(t), Stream: "s",
		AMQPURLs: []string{"amqp://u:p@10.0.0.1:5672/v", "amqps://u:p@10.0.0.2/v"}})
	require.NoError(t, err)
	require.Equal(t, "rabbitmq-stream://u:p@10.0.0.1:5552/v,rabbitmq-stream+tls://u:p@10.0.0.2:5552/v", c.Config().StreamURL)
	c, err = New(Config{Name: "test", Pool: testdb.Pool(t), Stream: "s", StreamURL: "rabbitmq-stream://h:1/",
		AMQPURL: "amqp://u:p@10.0.0.1:5672/v"})
	require.NoError(t, err)
	require.Equal(t, "rabbitmq-stream://h:1/", c.Config().StreamURL, "a StreamURL that is set is kept")
}
