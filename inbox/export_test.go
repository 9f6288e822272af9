package inbox

// DeleteScopeStatement is the statement of one DeleteScope chunk, for the
// tests of package inbox_test to look at its plan.
func DeleteScopeStatement(ib *Inbox) string { return ib.sql.deleteScope }

// ScopeChunk is how many rows one DeleteScope chunk deletes.
const ScopeChunk = scopeChunk
