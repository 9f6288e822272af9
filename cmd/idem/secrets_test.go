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
