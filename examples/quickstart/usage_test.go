package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// argsEnv, when set, makes the test binary run the quickstart command with
// these arguments (separated by \x1f) instead of the tests.
const argsEnv = "QUICKSTART_TEST_ARGS"

func TestMain(m *testing.M) {
	if args := os.Getenv(argsEnv); args != "" {
		os.Args = append([]string{"quickstart"}, strings.Split(args, "\x1f")...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// secretEnv are URLs with a password, as a deployment sets them.
var secretEnv = []string{
	"IDEM_AMQP_URL=amqp://app:s3cr3t-pa55@127.0.0.1:1/,amqp://app:s3cr3t-pa55@127.0.0.1:2/",
	"IDEM_PG_URL=postgres://app:s3cr3t-pa55@127.0.0.1:1/test",
}

// A mistyped flag, or -h, prints the usage text with the broker's URL as
// the default of -amqp-url: redacted, so that no password lands in a
// container's logs.
func TestUsageTextNeverShowsThePassword(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"worker", "-bogus"}, {"worker", "-h"}, {"publish", "-bogus"}, {"publish", "-h"},
		{"demo", "-bogus"}, {"-h"}, {"bogus"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(append(os.Environ(), secretEnv...), argsEnv+"="+strings.Join(args, "\x1f"))
		out, _ := cmd.CombinedOutput()
		require.NotContains(t, string(out), "s3cr3t-pa55", "quickstart %v", args)
		if args[0] != "-h" && args[0] != "bogus" {
			require.Contains(t, string(out), "amqp://app:xxxxx@127.0.0.1:1/", "quickstart %v shows the redacted default", args)
		}
	}
}
