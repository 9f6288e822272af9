package inbox

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// pointerArray is a one-dimensional array parameter that pgx encodes without
// an allocation per element. pgx reads array elements as interface values:
// a []string or [][]byte puts every element in an interface of its own, an
// allocation each. pointerArray hands out pointers to its elements instead
// (a pointer fits in an interface as is), and its element types give pgx
// their value through pgtype's valuer interfaces, not through reflection.
type pointerArray[T textElem | byteaElem] []T

// Dimensions implements pgtype.ArrayGetter; a nil array is SQL NULL.
func (a pointerArray[T]) Dimensions() []pgtype.ArrayDimension {
	if a == nil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(len(a)), LowerBound: 1}}
}

// Index implements pgtype.ArrayGetter.
func (a pointerArray[T]) Index(i int) any { return &a[i] }

// IndexType implements pgtype.ArrayGetter.
func (a pointerArray[T]) IndexType() any { return (*T)(nil) }

// textElem is a text element of a pointerArray.
type textElem string

// TextValue implements pgtype.TextValuer.
func (e *textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*e), Valid: true}, nil
}

// byteaElem is a bytea element of a pointerArray.
type byteaElem []byte

// BytesValue implements pgtype.BytesValuer.
func (e *byteaElem) BytesValue() ([]byte, error) { return *e, nil }

// portable returns args as pgx can send them on tx's connection. The exec
// and simple-protocol query modes (the usual ones behind PgBouncer) send
// parameters without their PostgreSQL type, and pgx then finds an encoding
// only for the types it knows: there, every pointerArray becomes the plain
// slice it stands for. The modes that describe a statement first get args
// as they are.
func portable(tx pgx.Tx, args []any) []any {
	switch tx.Conn().Config().DefaultQueryExecMode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
	default:
		return args
	}
	for i, a := range args {
		switch a := a.(type) {
		case pointerArray[textElem]:
			var plain []string // nil stays NULL
			for _, e := range a {
				plain = append(plain, string(e))
			}
			if a != nil && plain == nil {
				plain = []string{}
			}
			args[i] = plain
		case pointerArray[byteaElem]:
			var plain [][]byte
			for _, e := range a {
				plain = append(plain, e)
			}
			if a != nil && plain == nil {
				plain = [][]byte{}
			}
			args[i] = plain
		}
	}
	return args
}
