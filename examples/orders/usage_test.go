package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A mistyped flag, or -h, prints the usage text with the broker's URL as
// the default of -amqp-url: redacted, so that no password lands in a
// container's logs.
func TestUsageTextNeverShowsThePassword(t *testing.T) {
	t.Parallel()
	env := []string{
		"IDEM_AMQP_URL=amqp://app:s3cr3t-pa55@127.0.0.1:1/,amqp://app:s3cr3t-pa55@127.0.0.1:2/",
		"IDEM_PG_URL=postgres://app:s3cr3t-pa55@127.0.0.1:1/test",
		"IDEM_STREAM_URL=rabbitmq-stream://app:s3cr3t-pa55@127.0.0.1:1/",
	}
	for _, args := range [][]string{
		{"-bogus"}, {"-h"}, {"worker", "-bogus"}, {"publish", "-bogus"}, {"replay", "-bogus"}, {"bogus"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(append(os.Environ(), env...), argsEnv+"="+strings.Join(args, "\x1f"))
		out, _ := cmd.CombinedOutput()
		require.NotContains(t, string(out), "s3cr3t-pa55", "orders %v", args)
		if args[0] == "-bogus" || args[0] == "-h" {
			require.Contains(t, string(out), "amqp://app:xxxxx@127.0.0.1:1/", "orders %v shows the redacted default", args)
		}
	}
}
