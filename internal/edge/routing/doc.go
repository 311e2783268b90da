// Package routing is the choice policy of a model group: which of the
// candidates that can serve a request right now gets it (R1). It
// owns the routing modes (ordered, least_loaded, prefix_affinity), the
// prefix hash of a conversation (Hasher), the per-provider affinity table
// of recently routed prefixes (Table), each provider's prefill queue
// (Backlog) with its group's calibration (Fit) and the choice by longest matching prefix, weighed by the
// cost of the turn, with bounded-load rendezvous hashing (Choose).
//
// It must never do I/O, start goroutines, read a clock, log, or own a
// lease or a waiter: the provider pool (internal/edge/pool) calls it under
// its own lock with the candidates' state and carries out the choice. A
// candidate the pool cannot use (offline, overlaid, cooling, at capacity)
// is marked so by the pool; this package never makes a request wait.
//
// # Prefix affinity
//
// Inference servers keep a prefix cache (llama-server's KV cache and prompt
// cache report it as timings.cache_n, vLLM and SGLang as automatic prefix
// caching): a request whose prompt starts with a prompt the server has just
// processed skips that part of the prefill. The HTTP layer hashes each
// request's conversation at message boundaries — the shared preamble
// (tools, leading system messages) seeds the chain, then one cumulative
// hash per message from the first non-system message on — so that
// Prefix[i] names the whole conversation up to message i. Prefix[0], the
// conversation through its first user turn, is the conversation's key.
//
// Each provider remembers the prefixes routed to it in a Table (an LRU of
// bounded size). A request goes to the free candidate holding the longest
// prefix of it, whatever its share of the load (its capacity bounds it:
// turning a conversation away from its holder costs a full prefill of its
// history elsewhere). Among equal holders, or when no free candidate holds
// any prefix, rendezvous hashing (highest random weight, weighted by
// capacity) on the conversation key orders the candidates, and a
// candidate is taken only while its load stays within (1+ε) × its
// capacity share of the group's load, the bound of consistent hashing with
// bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018). So a new
// conversation lands on a deterministic provider unless that one already
// has more than its bounded share, its later turns follow it while it has
// a free slot, a provider that leaves or cools moves only the
// conversations it held, and no provider is handed new conversations
// beyond its bounded share while another has room.
//
// # The cost of a turn
//
// A holder's free slot is not free time: a backend works through the
// prompts it was given in turn. Each provider therefore has a Backlog, the
// pool's estimate of the prefill granted to it and not yet done, and each
// group a Fit of the time per token and of the delay per queued token and
// per busy slot that its providers' timed first bytes calibrate; Choose
// sends a held turn to the free candidate where its first token is
// expected soonest (Policy.Balance × the wait there plus the turn's own
// uncached prefill there), so the holder keeps its turns while little is
// queued on it and yields (ResultYield) when the wait would exceed the
// prefill it saves (cost.go).
//
// # Memory
//
// A Table holds at most its entry limit (DefaultTableEntries unless told
// otherwise) of 8-byte hashes; each entry costs TableEntryBytes bytes
// (the hash, two int32 LRU links and its map slot), so a provider's table
// at the default limit is about 1 MiB. A conversation of n messages uses at
// most n entries per provider it ran on.
package routing
