// Package protocol is the vocabulary the Edge and the Node share on the
// wire (proto/iop/runtime.proto carries it; SPEC W1–W6): the failure codes
// of ERROR and CANCELLED terminals with what each one means to both sides
// (failure.go), the operation names of tunnels and runs and the adapter
// types (ops.go), the built-in protocol profiles (profile.go), the health,
// liveness and fence values, the metadata and CAPABILITIES keys and the
// stall-timeout default (values.go).
//
// It is a leaf: it imports only the generated protobuf package, and both
// internal/edge/** and internal/node/** import it (they never import each
// other). Every value is written here once; a package that emits or reads
// one names the constant, never the string.
package protocol
