"""Tools shared by the tests and the benchmarks: the PgBouncer launcher, the
fault proxy and damaged copies of a store, and a meter of what a call sends."""
