// Package secretscmd implements the "edge secrets" subcommands, which manage
// the Edge's secret store (SPEC C1): init writes a store key, set stores a
// secret read from standard input, list prints slots and revisions, rm
// removes a slot.
//
// It owns flag parsing and reporting only; encryption lives in
// internal/edge/secretstore. It must never take a secret from the command
// line or the environment (both leak into process listings and shell
// history), never print a secret, a ciphertext or the key, and never call
// os.Exit: Main returns the exit code.
package secretscmd

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"iop/internal/edge/secretstore"
)

// Exit codes returned by Main.
const (
	ExitOK    = 0
	ExitError = 1 // I/O error, bad key or store, bad secret
	ExitUsage = 2 // bad subcommand or flags
)

const usage = `usage:
  edge secrets init -key FILE
  edge secrets set  -store FILE -key FILE -slot NAME    (the secret is read from standard input)
  edge secrets list -store FILE
  edge secrets rm   -store FILE -slot NAME
After set or rm, send SIGHUP to the running edge to use the new revision.
`

// Main runs "edge secrets <init|set|list|rm> flags..."; args are the words
// after "secrets". stdin is read by set only. now stamps updated_at.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer, now func() time.Time) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "edge secrets: missing subcommand\n"+usage)
		return ExitUsage
	}
	switch args[0] {
	case "init":
		return runInit(args[1:], stdout, stderr)
	case "set":
		return runSet(args[1:], stdin, stdout, stderr, now)
	case "list":
		return runList(args[1:], stdout, stderr)
	case "rm":
		return runRemove(args[1:], stdout, stderr, now)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	}
	fmt.Fprintf(stderr, "edge secrets: unknown subcommand %q\n%s", args[0], usage)
	return ExitUsage
}

// flags parses args into a flag set of the named string flags, all
// required; done reports whether the caller should return code at once.
func flags(cmd string, args []string, stderr io.Writer, names ...string) (vals map[string]*string, code int, done bool) {
	fs := flag.NewFlagSet("edge secrets "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	vals = map[string]*string{}
	help := map[string]string{"key": "store key file", "store": "secret store file", "slot": "slot name"}
	for _, n := range names {
		vals[n] = fs.String(n, "", help[n])
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, ExitOK, true
		}
		return nil, ExitUsage, true
	}
	if fs.NArg() > 0 {
		// Not echoed: it may be a secret typed in the wrong place.
		fmt.Fprintf(stderr, "edge secrets %s: unexpected argument (the secret is read from standard input, never from arguments)\n%s",
			cmd, usage)
		return nil, ExitUsage, true
	}
	for _, n := range names {
		if *vals[n] == "" {
			fmt.Fprintf(stderr, "edge secrets %s: missing -%s\n%s", cmd, n, usage)
			return nil, ExitUsage, true
		}
	}
	return vals, 0, false
}

func runInit(args []string, stdout, stderr io.Writer) int {
	v, code, done := flags("init", args, stderr, "key")
	if done {
		return code
	}
	if err := secretstore.WriteNewKey(*v["key"]); err != nil {
		return fail(stderr, "init", err)
	}
	fmt.Fprintf(stdout, "wrote %s (32-byte store key, mode 0600; keep it apart from backups of the store)\n", *v["key"])
	return ExitOK
}

func runSet(args []string, stdin io.Reader, stdout, stderr io.Writer, now func() time.Time) int {
	v, code, done := flags("set", args, stderr, "store", "key", "slot")
	if done {
		return code
	}
	if f, ok := stdin.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			fmt.Fprintln(stderr, "edge secrets set: reading the secret from standard input; end it with Enter and Ctrl-D")
		}
	}
	secret, err := readSecret(stdin)
	defer clear(secret)
	if err != nil {
		return fail(stderr, "set", err)
	}
	key, err := secretstore.LoadKey(*v["key"])
	if err != nil {
		return fail(stderr, "set", err)
	}
	defer key.Clear()
	unlock, err := secretstore.Lock(*v["store"])
	if err != nil {
		return fail(stderr, "set", err)
	}
	defer unlock()
	st, err := secretstore.LoadOrNew(*v["store"])
	if err != nil {
		return fail(stderr, "set", err)
	}
	// A store written under another key would become unreadable in part:
	// check that every slot opens with this key before adding one.
	for _, s := range st.Slots() {
		pt, _, err := st.Open(key, s.Name)
		clear(pt)
		if err != nil {
			return fail(stderr, "set", fmt.Errorf("%w (is -key the store's key?)", err))
		}
	}
	rev, err := st.Set(key, *v["slot"], secret, now())
	if err != nil {
		return fail(stderr, "set", err)
	}
	if err := st.Save(*v["store"]); err != nil {
		return fail(stderr, "set", err)
	}
	fmt.Fprintf(stdout, "slot %s: revision %d\n", *v["slot"], rev)
	return ExitOK
}

// readSecret reads the secret from r: everything up to EOF, without one
// trailing newline (LF or CRLF), at most MaxSecretBytes. It reads into one
// buffer of fixed size, so no partial copy of the secret is left behind in
// a grown and abandoned buffer (the caller clears the one it gets); on an
// error it clears what it read.
func readSecret(r io.Reader) ([]byte, error) {
	buf := make([]byte, secretstore.MaxSecretBytes+len("\r\n")+1)
	n, err := io.ReadFull(r, buf)
	switch {
	case err == nil: // filled: over the bound even without a CRLF
		clear(buf)
		return nil, fmt.Errorf("%w: standard input holds more than %d bytes", secretstore.ErrBadSecret, secretstore.MaxSecretBytes)
	case !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF):
		clear(buf)
		return nil, fmt.Errorf("read standard input: %w", err)
	}
	b := bytes.TrimSuffix(buf[:n], []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: standard input is empty (pipe the secret in: edge secrets set ... < FILE)", secretstore.ErrBadSecret)
	}
	return b, nil
}

func runList(args []string, stdout, stderr io.Writer) int {
	v, code, done := flags("list", args, stderr, "store")
	if done {
		return code
	}
	st, err := secretstore.Load(*v["store"])
	if err != nil {
		return fail(stderr, "list", err)
	}
	slots := st.Slots()
	if len(slots) == 0 {
		fmt.Fprintln(stdout, "no slots")
		return ExitOK
	}
	fmt.Fprintf(stdout, "%-32s %8s  %s\n", "SLOT", "REVISION", "UPDATED")
	for _, s := range slots {
		fmt.Fprintf(stdout, "%-32s %8d  %s\n", s.Name, s.Revision, s.UpdatedAt.Format(time.RFC3339))
	}
	return ExitOK
}

func runRemove(args []string, stdout, stderr io.Writer, now func() time.Time) int {
	v, code, done := flags("rm", args, stderr, "store", "slot")
	if done {
		return code
	}
	unlock, err := secretstore.Lock(*v["store"])
	if err != nil {
		return fail(stderr, "rm", err)
	}
	defer unlock()
	st, err := secretstore.Load(*v["store"])
	if err != nil {
		return fail(stderr, "rm", err)
	}
	if !st.Remove(*v["slot"], now()) {
		return fail(stderr, "rm", fmt.Errorf("%w %q", secretstore.ErrNoSlot, *v["slot"]))
	}
	if err := st.Save(*v["store"]); err != nil {
		return fail(stderr, "rm", err)
	}
	fmt.Fprintf(stdout, "slot %s removed\n", *v["slot"])
	return ExitOK
}

func fail(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "edge secrets %s: %v\n", cmd, err)
	return ExitError
}
