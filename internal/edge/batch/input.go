package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
)

// The input file read and checked line by line (SPEC X2): a line's place
// and its custom_id, model or what is wrong with it; a line over its bound
// is counted, never held whole.

// line is one input line as validation read it.
type line struct {
	no       int // 1-based
	off, n   int64
	customID string
	err      string // why it is malformed; "" = runnable
	model    string
}

// lineRequest is one input line (OpenAI's batch input line).
type lineRequest struct {
	CustomID *string         `json:"custom_id"`
	Method   *string         `json:"method"`
	URL      *string         `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// scan reads the input file's lines and checks each (SPEC X2): a JSON
// object with a custom_id (a string, unique in the file), method POST, url
// the batch's endpoint and a body object naming a model, not streamed.
// A blank last line is no line. A line over maxLine bytes (0 = no bound)
// is malformed, and is counted, never held whole.
func scan(f *os.File, endpoint string, maxLine int64) ([]line, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	br := lineReader(f)
	var lines []line
	seen := map[string]int{}
	var off int64
	for no := 1; ; no++ {
		b, n, over, err := readLine(br, maxLine)
		if n == 0 && err == io.EOF {
			break
		}
		if err != nil && err != io.EOF {
			return nil, err
		}
		l := line{no: no, off: off, n: n}
		off += n
		if over {
			l.err = fmt.Sprintf("%d bytes, over the bound of a line (%d: the edge's http.max_body_bytes and 64 KiB)", n, maxLine)
		} else {
			l.customID, l.model, l.err = check(bytes.TrimSpace(b), endpoint)
		}
		if l.err == "" {
			if first, dup := seen[l.customID]; dup {
				l.err = fmt.Sprintf("custom_id %q is the custom_id of line %d: each line needs its own", trunc(l.customID), first)
			} else {
				seen[l.customID] = no
			}
		}
		lines = append(lines, l)
		if err == io.EOF {
			break
		}
	}
	if len(lines) == 0 {
		return nil, ErrEmptyInput
	}
	return lines, nil
}

// readLine reads one line of br with its newline: its bytes (nil when
// over), its length n, and over when n passed max (0 = no bound); memory
// stays max and br's buffer whatever the line's length.
func readLine(br *bufio.Reader, max int64) (b []byte, n int64, over bool, err error) {
	for {
		frag, err := br.ReadSlice('\n')
		n += int64(len(frag))
		if !over {
			if max > 0 && n > max {
				over, b = true, nil
			} else {
				b = append(b, frag...)
			}
		}
		if err != bufio.ErrBufferFull {
			return b, n, over, err
		}
	}
}

func check(b []byte, endpoint string) (customID, model, problem string) {
	if len(b) == 0 {
		return "", "", "an empty line; each line is one JSON request"
	}
	var r lineRequest
	if err := json.Unmarshal(b, &r); err != nil {
		return "", "", "not a JSON object: " + err.Error()
	}
	if r.CustomID != nil {
		customID = *r.CustomID
	}
	switch {
	case r.CustomID == nil || *r.CustomID == "":
		return customID, "", "custom_id: want a non-empty string"
	case len(*r.CustomID) > 512:
		return customID, "", "custom_id: at most 512 bytes"
	case r.Method == nil || *r.Method != http.MethodPost:
		return customID, "", `method: want "POST"`
	case r.URL == nil || *r.URL != endpoint:
		got := ""
		if r.URL != nil {
			got = *r.URL
		}
		return customID, "", fmt.Sprintf("url: want the batch's endpoint %q, got %q", endpoint, trunc(got))
	}
	var body struct {
		Model  *string `json:"model"`
		Stream *bool   `json:"stream"`
	}
	if len(r.Body) == 0 || r.Body[0] != '{' || json.Unmarshal(r.Body, &body) != nil {
		return customID, "", "body: want a JSON object, the request's body"
	}
	if body.Model == nil || *body.Model == "" {
		return customID, "", "body.model: want the model group's name"
	}
	if body.Stream != nil && *body.Stream {
		return customID, *body.Model, "body.stream: a batch's answers are not streamed; drop stream or set it false"
	}
	return customID, *body.Model, ""
}

func trunc(s string) string {
	if len(s) > 128 {
		return s[:128] + "…"
	}
	return s
}
