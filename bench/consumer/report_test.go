package main

import "testing"

func TestMedianOfOddAndEvenCounts(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{7}, 7},
		{nil, 0},
	} {
		if got := median(c.xs); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}

func TestRatioSummaryCountsTheSegmentsWithinTheTarget(t *testing.T) {
	// A stalled broker segment (ratio 0.02) and a stalled idem segment
	// (18.2) move neither the median nor the count of the others.
	got := ratioSummary([]float64{2.5, 0.02, 18.2, 1.5, 2.3})
	want := "2.30× (segments 0.02–18.20×, 2 of 5 within)"
	if got != want {
		t.Errorf("ratioSummary = %q, want %q", got, want)
	}
}
