package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/inbox/httpinbox"
)

// POST /captures:bulk takes many capture requests in one request, with an
// Idempotency-Key for the operation and an itemKey per capture:
//
//	{"items":[{"itemKey":"c-1","orderId":"o-1","amount":1234,"currency":"EUR"},…]}
//
// and answers each item accepted (with its captureRequestId), rejected (with
// a problem) or already_accepted (an earlier operation accepted its key: its
// captureRequestId again, never a second capture).
const (
	// bulkOperation scopes the operation keys of POST /captures:bulk; its
	// item keys are scoped by bulkOperation + ".item".
	bulkOperation = "captures.bulk"
	// maxBulkItems bounds the captures of one bulk request.
	maxBulkItems = 100
)

// bulkCaptureItem is one item of POST /captures:bulk.
type bulkCaptureItem struct {
	ItemKey string `json:"itemKey"`
	captureCreate
}

// bulkCaptureAccepted is what an accepted item adds to its result.
type bulkCaptureAccepted struct {
	CaptureRequestID string `json:"captureRequestId"`
	Location         string `json:"location"`
}

// captureItem is the item handler of POST /captures:bulk: the capture of
// one item, accepted like a capture of POST /captures, under the item's key
// (its captureRequestId comes from that key, whichever operation carries
// it).
func (a *api) captureItem(ctx context.Context, tx pgx.Tx, item json.RawMessage) (any, error) {
	var it bulkCaptureItem
	if err := decodeOne(bytes.NewReader(item), &it); err != nil {
		return nil, httpinbox.Invalid(err)
	}
	c, err := it.validate()
	if err != nil {
		return nil, httpinbox.Invalid(err)
	}
	resp, err := a.acceptCapture(ctx, tx, c)
	switch {
	case err != nil:
		return nil, err
	case resp.Status >= http.StatusBadRequest:
		return nil, httpinbox.Reject(resp)
	}
	id := captureRequestID(httpinbox.FromContext(ctx))
	return bulkCaptureAccepted{CaptureRequestID: id, Location: "/captures/" + id}, nil
}
