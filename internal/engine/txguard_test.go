package engine

import "testing"

func TestTransactionControlIsFoundInEveryStatementButNotInsideLiteralsOrBodies(t *testing.T) {
	refused := []string{
		"COMMIT", "commit;", "  ROLLBACK", "END", "abort", "BEGIN", "start transaction",
		"SAVEPOINT x", "release savepoint x", "ROLLBACK TO SAVEPOINT idem_message",
		"PREPARE TRANSACTION 'x'", "UPDATE t SET a = 1; COMMIT", "-- note\nCOMMIT",
		"/* a /* nested */ comment */ ROLLBACK", "SELECT 1;\n\tcommit", "SELECT 'x;' ; END",
		"SELECT $$;$$; COMMIT", "SELECT E'\\';'; COMMIT",
	}
	for _, sql := range refused {
		if _, ok := transactionControl(sql); !ok {
			t.Errorf("not refused: %q", sql)
		}
	}
	allowed := []string{
		"SELECT 'commit'", `SELECT "commit" FROM t`, "DO $$ BEGIN PERFORM 1; END $$",
		"DO $body$ BEGIN COMMIT; END $body$", "UPDATE t SET note = 'rollback; commit' WHERE id = $1",
		"-- COMMIT\nSELECT 1", "/* BEGIN */ SELECT 1", "PREPARE stmt AS SELECT 1",
		"INSERT INTO commits (x) VALUES (1)", "SELECT x AS end_date FROM t", "SELECT E'it''s; commit'",
		"WITH c AS (SELECT 1) SELECT * FROM c", "",
	}
	for _, sql := range allowed {
		if word, ok := transactionControl(sql); ok {
			t.Errorf("refused %q (%s)", sql, word)
		}
	}
}

func FuzzTransactionControlNeverPanics(f *testing.F) {
	for _, s := range []string{"COMMIT", "SELECT $$", "/*", "E'\\", `"`, "$a$ x $a", "PREPARE"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) { transactionControl(sql) })
}

func TestRowKeysNameEqualStatementsAlikeAndOthersApart(t *testing.T) {
	const upd = "UPDATE accounts SET balance = balance + 1 WHERE id = $1"
	if rowKey(upd, []any{int32(7)}) != rowKey(upd, []any{int32(7)}) {
		t.Error("one statement with one argument must name one row")
	}
	for _, other := range [][]any{{int32(8)}, {int32(7), 1}, {"7"}, nil} {
		if rowKey(upd, []any{int32(7)}) == rowKey(upd, other) {
			t.Errorf("args %v named the same row as 7", other)
		}
	}
	for sql, want := range map[string]bool{
		upd: true, " insert into t values (1)": true, "/* x */ DELETE FROM t": true, "(UPDATE t SET a = 1)": true,
		"SELECT * FROM t": false, "WITH x AS (SELECT 1) SELECT * FROM x": false, "": false, "merge into t using s on true": true,
	} {
		if isWrite(sql) != want {
			t.Errorf("isWrite(%q) = %v", sql, !want)
		}
	}
}

func TestWriteKeysBelongToOneBatchUntilItEnds(t *testing.T) {
	k := newWriteKeys()
	a, b := &batch{}, &batch{}
	if !k.take(a, 1, false) || !k.take(a, 1, false) {
		t.Fatal("a batch may take its own key again")
	}
	if k.take(b, 1, false) {
		t.Fatal("another batch's key was taken")
	}
	k.release(b, []uint64{1}) // not b's: stays a's
	if k.take(b, 1, false) {
		t.Fatal("released by a batch that did not own it")
	}
	k.release(a, []uint64{1})
	if !k.take(b, 1, false) {
		t.Fatal("a's key not free after a ended")
	}
	k.abandon(b)
	if n := k.held(); n != 0 {
		t.Fatalf("%d keys left after the last holder was abandoned", n)
	}
}

// A batch that writes a row another batch holds (its message could not be
// postponed) holds it too, after the other's lock: a third batch must not
// find the row free once the first ends, or it waits on the second's lock
// and takes the wait for another process's.
func TestWriteKeysStayHeldUntilEveryBatchThatWroteTheRowEnded(t *testing.T) {
	k := newWriteKeys()
	a, b, c := &batch{}, &batch{}, &batch{}
	k.take(a, 1, false)
	if k.take(b, 1, true) {
		t.Fatal("b wrote a's row: not alone")
	}
	k.release(a, []uint64{1})
	if k.take(c, 1, false) {
		t.Fatal("the row was free while b still held its lock")
	}
	if !k.take(b, 1, false) {
		t.Fatal("b holds the row alone once a ended")
	}
	k.release(b, []uint64{1})
	if !k.take(c, 1, false) {
		t.Fatal("the row stayed held after every holder ended")
	}
}

// An abandoned batch's keys are released for good: whatever its handler
// still writes is not recorded, even when it raced with the abandonment.
func TestAnAbandonedBatchTakesNoKeys(t *testing.T) {
	k := newWriteKeys()
	a, b := &batch{}, &batch{}
	k.take(a, 1, false)
	k.take(b, 1, true)
	k.abandon(a)
	if !k.take(a, 2, false) {
		t.Fatal("an abandoned batch's write must not be postponed")
	}
	if k.held() != 1 || !k.take(b, 1, false) {
		t.Fatal("the abandoned batch still holds keys")
	}
}
