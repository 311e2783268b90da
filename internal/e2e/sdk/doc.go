// Package sdk is iop's end-to-end suite: it starts the built edge, node and
// demo-backend binaries as real processes and drives them with the official
// OpenAI and Anthropic Go SDKs (issue 6). It lives in its own module so the
// product's go.mod stays protobuf-only.
package sdk
