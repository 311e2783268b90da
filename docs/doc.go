// Package docs holds the repository's documentation (the Markdown pages in
// this directory) and the test that keeps it and the code in step: every
// requirement ID the code cites is defined in requirements.md, every test
// requirements.md names exists, every package under internal/ has its line
// in README.md's layout, README.md stays within 150 lines and BENCHMARKS.md
// within 300, every link and backquoted path resolves, and no page points
// outside the repository.
//
// It has no code besides this comment; nothing imports it.
package docs
