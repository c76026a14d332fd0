package idempotency

// VersionQueries: how many version queries the package has sent (the
// tests check it is one per *sql.DB).
func VersionQueries() int64 { return versionQueries.Load() }
