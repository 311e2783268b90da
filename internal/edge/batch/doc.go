// Package batch is the OpenAI Batch and Files API the edge runs itself
// (SPEC X1-X6; OpenAI API reference, "Files" and "Batch"): a key uploads a
// JSONL file of requests (POST /v1/files, purpose "batch"), makes a batch
// of it (POST /v1/batches), and downloads the answers as JSONL (GET
// /v1/files/{id}/content of the batch's output_file_id and
// error_file_id). Each line runs through the edge's normal request path as
// its key, at the lowest priority, at most batches.max_in_flight lines of
// a batch at once.
//
// # Files
//
//   - machine.go: the batch's state machine, pure: Machine.Step(event) →
//     (machine, effects); statuses validating, in_progress, finalizing,
//     completed, failed, cancelling, cancelled, expired (TestX2BatchMachine).
//   - store.go: the files and batch records in batches.dir, written as the
//     key store is (storefile: temporary file, fsync, rename), one edge per
//     dir (flock); journal.go: a batch's answered lines, its done-set.
//   - manager.go: the Manager, its Options, and each batch that has not
//     ended (active) with step, which applies an event to its machine and
//     persists the record; batches.go: Create, Get, List, Cancel.
//   - run.go: one driver goroutine per batch that has not ended, which
//     validates its input (input.go: a malformed line is answered in the
//     error file with its number), runs its lines through the edge's client
//     handler as its key with Iop-Priority: batch, at most
//     batches.max_in_flight at once, and writes its output and error files
//     (output.go: a line's answer, the files from the journal); a stop
//     (cancel, the key revoked, the window ended, the edge closing) cancels
//     the lines in flight, which are not journaled.
//   - http.go: /v1/files and /v1/batches in OpenAI's shapes; status.go:
//     the batches in progress per key for /status and /metrics (X6).
//
// # Restart
//
// A line is answered when its entry is in the journal; the output is
// written from the journal. After kill -9 the edge resumes every batch
// that had not ended: the lines in the journal keep their answers, the
// others run, including those in flight at the crash (they ran once
// already, unjournaled: a backend may have served them twice, the output
// has them once).
//
// # What it never does
//
// It never shows a file or batch to another key than the one that made it
// (another key's id is a 404, as an unknown one), never answers a line
// twice in a batch's output (the journal refuses a line already there),
// and never writes a file a crash can leave half-written: a file is there
// when its metadata is, and its metadata is renamed into place after its
// content.
package batch
