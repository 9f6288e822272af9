package sqltext

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
		if _, ok := ControlWord(sql); !ok {
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
		if word, ok := ControlWord(sql); ok {
			t.Errorf("refused %q (%s)", sql, word)
		}
	}
}

func FuzzTransactionControlNeverPanics(f *testing.F) {
	for _, s := range []string{"COMMIT", "SELECT $$", "/*", "E'\\", `"`, "$a$ x $a", "PREPARE"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) { ControlWord(sql) })
}

func TestRowKeysNameEqualStatementsAlikeAndOthersApart(t *testing.T) {
	const upd = "UPDATE accounts SET balance = balance + 1 WHERE id = $1"
	if RowKey(upd, []any{int32(7)}) != RowKey(upd, []any{int32(7)}) {
		t.Error("one statement with one argument must name one row")
	}
	for _, other := range [][]any{{int32(8)}, {int32(7), 1}, {"7"}, nil} {
		if RowKey(upd, []any{int32(7)}) == RowKey(upd, other) {
			t.Errorf("args %v named the same row as 7", other)
		}
	}
	for sql, want := range map[string]bool{
		upd: true, " insert into t values (1)": true, "/* x */ DELETE FROM t": true, "(UPDATE t SET a = 1)": true,
		"SELECT * FROM t": false, "WITH x AS (SELECT 1) SELECT * FROM x": false, "": false, "merge into t using s on true": true,
	} {
		if IsWrite(sql) != want {
			t.Errorf("IsWrite(%q) = %v", sql, !want)
		}
	}
}
