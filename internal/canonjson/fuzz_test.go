package canonjson_test

import (
	"math/big"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/canonjson"
)

// FuzzNumberSpellings: every spelling of one decimal value, m×10^e written
// as plain digits, with a fraction, with trailing zeros, with e or E and a
// signed exponent (1000, 1000.0, 1e3, 10E+2, 0.1e4), canonicalises to one
// spelling, which is that value exactly (never rounded to a float64); and
// the next value up, (m+1)×10^e, canonicalises to another. As an id field,
// every spelling is the one id that canonical spelling is.
func FuzzNumberSpellings(f *testing.F) {
	f.Add(uint64(1), int16(3), false, uint8(0))
	f.Add(uint64(1000), int16(0), false, uint8(1))
	f.Add(uint64(12345678901234567891), int16(-20), true, uint8(3))
	f.Add(uint64(0), int16(-7), true, uint8(2))
	f.Add(uint64(5), int16(-400), false, uint8(9))
	f.Fuzz(func(t *testing.T, m uint64, e int16, neg bool, pad uint8) {
		exp := int(e) % 500
		zeros := int(pad % 12)
		spellings := spell(m, exp, zeros, neg)
		want, err := canonjson.Canonical([]byte(spellings[0]))
		if err != nil {
			t.Fatalf("%q: %v", spellings[0], err)
		}
		for _, s := range spellings[1:] {
			got, err := canonjson.Canonical([]byte(s))
			if err != nil || string(got) != string(want) {
				t.Fatalf("%q canonicalises to %s, %q to (%s, %v)", spellings[0], want, s, got, err)
			}
			inObject, err := canonjson.Canonical([]byte(`{"n":` + s + `}`))
			if err != nil || string(inObject) != `{"n":`+string(want)+`}` {
				t.Fatalf("%q inside an object: (%s, %v)", s, inObject, err)
			}
			if id, err := canonjson.FieldID([]byte(`{"n":`+s+`}`), "n"); err != nil || id != string(want) {
				t.Fatalf("the id %q is (%q, %v), not its canonical spelling %s", s, id, err, want)
			}
		}
		value := decimal(new(big.Int).SetUint64(m), exp, neg)
		read, ok := new(big.Rat).SetString(string(want))
		if !ok || read.Cmp(value) != 0 {
			t.Fatalf("%q canonicalises to %s, which is not %s", spellings[0], want, value.RatString())
		}
		if m == ^uint64(0) {
			return
		}
		next, err := canonjson.Canonical([]byte(spell(m+1, exp, zeros, neg)[0]))
		if err != nil || string(next) == string(want) {
			t.Fatalf("%d×10^%d and the next value up are one canonical number %s (%v)", m, exp, want, err)
		}
	})
}

// spell writes m×10^exp (negated when neg) in several JSON spellings, the
// plain decimal first; zeros pads the mantissa with that many trailing zeros.
func spell(m uint64, exp, zeros int, neg bool) []string {
	sign := ""
	if neg {
		sign = "-"
	}
	digits := strconv.FormatUint(m, 10)
	if m == 0 {
		zeros = 0 // 000 is no JSON number
	}
	padded := digits + strings.Repeat("0", zeros)
	out := []string{sign + plain(digits, exp)}
	for _, s := range []string{
		digits + "e" + strconv.Itoa(exp),
		digits + "E+" + strconv.Itoa(exp),
		padded + "e" + strconv.Itoa(exp-zeros),
		plain(padded, exp-zeros),
		digits + "." + strings.Repeat("0", zeros+1) + "e" + strconv.Itoa(exp),
		"0." + digits + "e" + strconv.Itoa(exp+len(digits)),
		plain(digits, exp) + "e0",
	} {
		out = append(out, sign+strings.Replace(s, "E+-", "E-", 1))
	}
	return out
}

// plain writes digits×10^exp without an exponent.
func plain(digits string, exp int) string {
	if exp >= 0 {
		if digits == "0" {
			return "0"
		}
		return digits + strings.Repeat("0", exp)
	}
	if n := len(digits) + exp; n > 0 {
		return digits[:n] + "." + digits[n:]
	}
	return "0." + strings.Repeat("0", -exp-len(digits)) + digits
}

// decimal is m×10^exp, negated when neg.
func decimal(m *big.Int, exp int, neg bool) *big.Rat {
	p := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(max(exp, -exp))), nil)
	r := new(big.Rat).SetInt(m)
	if exp >= 0 {
		r.Mul(r, new(big.Rat).SetInt(p))
	} else {
		r.Quo(r, new(big.Rat).SetInt(p))
	}
	if neg {
		r.Neg(r)
	}
	return r
}
