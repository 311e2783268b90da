// Package e2e holds iop's in-process integration tests and benchmarks: the
// real Edge (internal/edge.Serve) and real Nodes (internal/node.Run) in one test
// process, talking mutual TLS over 127.0.0.1 with certificates from
// identity.InitPKI, in front of the deterministic demo backend
// (internal/demo/backend). Clients are plain net/http clients on the Edge's
// HTTP listener; observations come from the admin surface (/status,
// /metrics, /events), the demo backend's request-end hook and in-test TCP
// relays.
//
// The package has no non-test code besides this comment. It must never be
// imported, never reach an address outside the loopback range, and never
// leave a goroutine behind: every test checks that the goroutine count
// returns to where it started. The official-SDK suite that drives the built
// binaries is the separate module in ./sdk.
package e2e
