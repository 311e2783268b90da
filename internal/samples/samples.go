// Package samples gives tests the byte-exact backend captures committed
// under testdata/samples (copied from the captures of real Ollama 0.17 and
// llama-server; see testdata/samples/README) and a JSON comparison for
// golden tests. It is test support: the edge and node binaries never
// import it (./run.sh test checks).
package samples

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// Dir is the absolute path of testdata/samples, found from this source
// file's location, so it works from any package's test directory.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "samples")
}

// Read returns the capture name; a missing file fails t.
func Read(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(), name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ReadHTTP splits a "*.http" capture (status line, blank line, body) into
// its status code and body.
func ReadHTTP(t testing.TB, name string) (status int, body []byte) {
	t.Helper()
	b := Read(t, name)
	head, body, ok := bytes.Cut(b, []byte("\r\n\r\n"))
	if !ok {
		if head, body, ok = bytes.Cut(b, []byte("\n\n")); !ok {
			t.Fatalf("%s: no blank line after the status line", name)
		}
	}
	f := strings.Fields(string(head))
	if len(f) < 2 {
		t.Fatalf("%s: no status line", name)
	}
	code, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatalf("%s: status %q: %v", name, f[1], err)
	}
	return code, body
}

// JSONEqual reports whether a and b are the same JSON value (object keys in
// any order, any spacing); it fails t when either is not JSON.
func JSONEqual(t testing.TB, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}
