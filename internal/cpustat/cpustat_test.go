package cpustat

import "testing"

func TestParseSplitsBusyIdleAndSteal(t *testing.T) {
	got := parse("cpu  100 5 50 800 20 3 2 40 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
	want := Times{Total: 1020, Busy: 160, Steal: 40}
	if got != want {
		t.Fatalf("parse = %+v, want %+v", got, want)
	}
	if p := want.StealSince(Times{Total: 1000 - 980, Steal: 20}); p != 2 {
		t.Fatalf("StealSince = %v, want 2", p) // 20 stolen of 1000
	}
	if (Times{}) != parse("garbage") {
		t.Fatal("a line that is not the cpu line must read as zero")
	}
}
