package soakworker

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseCrashFindsTheMarkerAboveAPanicTrace(t *testing.T) {
	t.Parallel()
	log := []byte("time=… level=INFO msg=\"worker started\"\n" +
		CrashMarker + " " + FaultCrashPanic + " s1-crash-panic-2\n" +
		"panic: soak: poison message s1-crash-panic-2\n\ngoroutine 42 [running]:\nmain.crash.func1()\n")
	fault, id, ok := ParseCrash(log)
	require.True(t, ok)
	require.Equal(t, FaultCrashPanic, fault)
	require.Equal(t, "s1-crash-panic-2", id)
	require.Equal(t, 2, ExitStatus(fault))
	require.Equal(t, 3, ExitStatus(FaultCrashExit))
}

func TestParseCrashIgnoresLinesThatOnlyLookLikeAMarker(t *testing.T) {
	t.Parallel()
	for _, log := range []string{
		"",
		"level=ERROR msg=\"handler failed\"\n",
		CrashMarker + " " + FaultHangSQL + " s1-hang-sql-1\n", // not a crash fault
		CrashMarker + " " + FaultCrashExit + "\n",             // no message id
		"x " + CrashMarker + " " + FaultCrashExit + " m\n",    // not at the start of a line
	} {
		_, _, ok := ParseCrash([]byte(log))
		require.False(t, ok, "%q", log)
	}
}

func TestBodyOfAHealthyDepositHasNoFaultField(t *testing.T) {
	t.Parallel()
	require.JSONEq(t, `{"account":"L1","amount":5}`, string(Body("L1", 5, "")))
	require.JSONEq(t, `{"account":"L1","amount":5,"fault":"hang_go"}`, string(Body("L1", 5, FaultHangGo)))
}
