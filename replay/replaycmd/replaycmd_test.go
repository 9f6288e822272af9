package replaycmd

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/replay"
)

func TestMainRejectsBadArgumentsWithExitCode2(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--mode", "forensic", "--from", "yesterday"},
		{"--mode", "forensic", "--to", "-3"},
		{"--mode", "normal", "extra"},
		{"--mode", "normal", "--report", "x.jsonl"},
		{"--mode", "rebuild", "--abandon"},
		{"--mode", "forensic", "--abandon", "--run-id", "r-1"},
		{"--no-such-flag"},
	} {
		var out, errOut bytes.Buffer
		err := Main(context.Background(), nil, args, Command{Stdout: &out, Stderr: &errOut})
		require.ErrorIs(t, err, ErrUsage, "%q", args)
		require.Equal(t, 2, ExitCode(err))
	}
	require.Equal(t, 0, ExitCode(nil))
	require.Equal(t, 0, ExitCode(flag.ErrHelp))
	require.Equal(t, 1, ExitCode(fmt.Errorf("run: %w", replay.ErrFindings)))
	require.Equal(t, 2, ExitCode(errors.New("database down")))
}
