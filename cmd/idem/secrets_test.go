package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestDatabasePasswordNeverAppearsInCLIOutput(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"postgres://root:s3cr3t-pa55@127.0.0.1:1/test",         // unreachable
		"postgres://root:s3cr3t-pa55@127.0.0.1:1/test?%zz=bad", // unparseable
	} {
		for _, args := range [][]string{{"inbox", "stats"}, {"ledger", "stats"}, {"migrate"}} {
			var out, errOut bytes.Buffer
			code := run(context.Background(), append(args, "--pg-url", url), &out, &errOut)
			if code == 0 {
				t.Fatalf("%v against %s succeeded", args, url)
			}
			if s := out.String() + errOut.String(); strings.Contains(s, "s3cr3t-pa55") {
				t.Fatalf("%v printed the password: %s", args, s)
			}
		}
	}
}

func TestBrokerPasswordNeverAppearsInRedriveOutput(t *testing.T) {
	t.Parallel()
	f := newCLIFixture(t)
	for _, url := range []string{
		"amqp://guest:s3cr3t-pa55@127.0.0.1:1/",          // unreachable
		"amqp://guest:s3cr3t-pa55@127.0.0.1:1/%zz?x=bad", // unparseable
		"amqp://guest:s3cr3t-pa55@127.0.0.1:5672/",       // refused credentials
	} {
		out, stderr, code := f.cmd("deadletters", "redrive", "--queue", "q", "--amqp-url", url)
		if code == 0 {
			t.Fatalf("redrive against %s succeeded", url)
		}
		if strings.Contains(out+stderr, "s3cr3t-pa55") {
			t.Fatalf("redrive printed the password: %s%s", out, stderr)
		}
	}
}

// A mistyped flag, or --help, of any command prints its usage text, and
// neither the database's nor the broker's password: the URLs are never
// flag defaults.
func TestUsageTextNeverShowsAPassword(t *testing.T) {
	t.Setenv("IDEM_PG_URL", "postgres://app:s3cr3t-pa55@127.0.0.1:1/test")
	t.Setenv("IDEM_AMQP_URL", "amqp://app:s3cr3t-pa55@127.0.0.1:1/,amqp://app:s3cr3t-pa55@127.0.0.1:2/")
	for _, args := range [][]string{
		{"--bogus"}, {"--help"}, {"bogus"},
		{"migrate", "--bogus"}, {"migrate", "--help"}, {"cleanup", "--bogus"}, {"console", "--bogus"},
		{"console", "--help"}, {"inbox", "stats", "--bogus"}, {"ledger", "list", "--bogus"},
		{"deadletters", "redrive", "--bogus"}, {"deadletters", "redrive", "--help"},
		{"operations", "list", "--bogus"}, {"replay", "--bogus"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), args, &out, &errOut)
		s := out.String() + errOut.String()
		if !strings.Contains(s, "usage") {
			t.Fatalf("idem %v (exit %d) printed no usage text: %s", args, code, s)
		}
		if strings.Contains(s, "s3cr3t-pa55") {
			t.Fatalf("idem %v printed the password: %s", args, s)
		}
	}
}
