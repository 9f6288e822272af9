// Package keyset writes and reads the cursors of the operator listings
// (ledger.Filter.After, httpinbox.KeyFilter.After): the position of the
// last row of a page, ordered by (created_at, id), from which the next
// page goes on. A cursor is opaque to its users: URL-safe base64 of the
// time in microseconds since the Unix epoch (PostgreSQL's precision), a
// colon and the id.
package keyset

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"
)

// ErrCursor is a cursor this package did not write.
var ErrCursor = errors.New("not a cursor of this listing")

// maxCursor bounds what Decode reads, in bytes: a cursor comes from a
// person or a URL.
const maxCursor = 4096

// Encode returns the cursor of the row created at t with id id.
func Encode(t time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(t.UnixMicro(), 10) + ":" + id))
}

// Decode returns the time and id of cursor c, or an error wrapping
// ErrCursor.
func Decode(c string) (time.Time, string, error) {
	if len(c) > maxCursor {
		return time.Time{}, "", ErrCursor
	}
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", ErrCursor
	}
	micro, id, ok := strings.Cut(string(raw), ":")
	if !ok {
		return time.Time{}, "", ErrCursor
	}
	n, err := strconv.ParseInt(micro, 10, 64)
	if err != nil || strings.HasPrefix(micro, "+") {
		return time.Time{}, "", ErrCursor
	}
	t := time.UnixMicro(n).UTC()
	if t.Year() < 1 || t.Year() > 9999 { // beyond what the database stores
		return time.Time{}, "", ErrCursor
	}
	return t, id, nil
}

// Walk reads a listing page by page: list(after) returns the page after
// the cursor after ("" for the first), at most limit rows; Walk calls
// each on every row in order, and goes on after the last row's cursor
// until a page comes back short. It stops at the first error of list or
// each.
func Walk[T any](limit int, list func(after string) ([]T, error), cursor func(T) string, each func(T) error) error {
	after := ""
	for {
		page, err := list(after)
		if err != nil {
			return err
		}
		for _, row := range page {
			if err := each(row); err != nil {
				return err
			}
		}
		if len(page) < limit || len(page) == 0 {
			return nil
		}
		after = cursor(page[len(page)-1])
	}
}
