package surface

import (
	"encoding/json"
	"testing"
)

// FuzzAppendString: the encoding decodes back to what encoding/json's own
// encoding decodes to (invalid UTF-8 becomes U+FFFD the same way).
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", "q\"b\\", "\n\r\t\x00\x1f", "é\u2028\u2029", "\xff\xfe", "<&>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		enc := AppendString(nil, s)
		var got, want string
		if err := json.Unmarshal(enc, &got); err != nil {
			t.Fatalf("invalid JSON %q for %q: %v", enc, s, err)
		}
		ref, _ := json.Marshal(s)
		_ = json.Unmarshal(ref, &want)
		if got != want {
			t.Fatalf("%q: got %q, want %q", s, got, want)
		}
	})
}
