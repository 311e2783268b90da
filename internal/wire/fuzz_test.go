package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

var updateSeeds = flag.Bool("update", false, "rewrite testdata/fuzz/FuzzReader from fuzzSeeds")

// chunkReader hands data out the way a network might: the first Read returns
// at most data[:split], later ones at most step bytes each (step 0 = all that
// fits). With eofWithData the final bytes come together with io.EOF.
type chunkReader struct {
	data        []byte
	split, step int
	eofWithData bool
	off         int
}

func newChunkReader(data []byte, split, step uint16) *chunkReader {
	return &chunkReader{data: data, split: int(split) % (len(data) + 1), step: int(step & 0x7fff), eofWithData: step&0x8000 != 0}
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if c.off == len(c.data) {
		return 0, io.EOF
	}
	end := len(c.data)
	switch {
	case c.off < c.split:
		end = c.split
	case c.step > 0:
		end = min(end, c.off+c.step)
	}
	n := copy(p, c.data[c.off:end])
	c.off += n
	if c.eofWithData && c.off == len(c.data) {
		return n, io.EOF
	}
	return n, nil
}

// modelStream is the reference framer: the frames a stream holds under cap
// limit and the error that ends it (SPEC W1).
func modelStream(data []byte, limit int) ([][]byte, error) {
	var frames [][]byte
	for {
		switch {
		case len(data) == 0:
			return frames, io.EOF
		case len(data) < HeaderSize:
			return frames, ErrTruncated
		}
		n := uint64(binary.BigEndian.Uint32(data))
		data = data[HeaderSize:]
		switch {
		case n == 0:
			return frames, ErrEmptyFrame
		case n > uint64(limit):
			return frames, ErrFrameTooLarge
		case uint64(len(data)) < n:
			return frames, ErrTruncated
		}
		frames = append(frames, data[:n])
		data = data[n:]
	}
}

// FuzzReader feeds arbitrary bytes, cut into arbitrary reads, through a
// Reader with a small cap (1 to 65536 bytes). It must never panic, never
// return a body over the cap, agree with modelStream frame by frame, and
// round-trip every envelope it decodes (SPEC W1, W5). Seeds, including one
// stream split at every byte boundary, live in testdata/fuzz/FuzzReader.
func FuzzReader(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, maxFrame, split, step uint16) {
		limit := int(maxFrame) + 1
		wantFrames, wantErr := modelStream(data, limit)
		r := NewReader(newChunkReader(data, split, step), limit)
		for i := 0; ; i++ {
			body, err := r.ReadFrame()
			if err != nil {
				if !errors.Is(err, wantErr) || i != len(wantFrames) {
					t.Fatalf("frame %d: got %v, want %v after %d frames", i, err, wantErr, len(wantFrames))
				}
				var fe *FrameError
				if err != io.EOF && !errors.As(err, &fe) {
					t.Fatalf("frame %d: got %T %v, want io.EOF or *FrameError", i, err, err)
				}
				return
			}
			if len(body) == 0 || len(body) > limit {
				t.Fatalf("frame %d: body of %d bytes under cap %d", i, len(body), limit)
			}
			if i >= len(wantFrames) || !bytes.Equal(body, wantFrames[i]) {
				t.Fatalf("frame %d: got %x, want the model's frame", i, body)
			}
			checkRoundTrip(t, body)
		}
	})
}

// checkRoundTrip decodes body; an envelope with a payload must survive
// Writer → Reader unchanged, one without must be refused by the Writer.
func checkRoundTrip(t *testing.T, body []byte) {
	t.Helper()
	var env iop.Envelope
	err := Decode(body, &env)
	var buf bytes.Buffer
	switch {
	case errors.Is(err, ErrMalformed):
		return
	case errors.Is(err, ErrNoPayload):
		if werr := NewWriter(&buf, 0).WriteEnvelope(&env); !errors.Is(werr, ErrNoPayload) && !errors.Is(werr, ErrEmptyFrame) {
			t.Fatalf("W2 writing an envelope without payload: got %v, want a refusal", werr)
		}
		return
	case err != nil:
		t.Fatalf("Decode: unexpected error %v", err)
	}
	if err := NewWriter(&buf, 0).WriteEnvelope(&env); err != nil {
		t.Fatalf("WriteEnvelope of a decoded envelope: %v", err)
	}
	var got iop.Envelope
	if err := NewReader(&buf, DefaultMaxFrame).ReadEnvelope(&got); err != nil {
		t.Fatalf("ReadEnvelope of a written envelope: %v", err)
	}
	if !proto.Equal(&got, &env) {
		t.Fatalf("round trip:\n got %v\nwant %v", &got, &env)
	}
}

// fuzzSeed is one corpus entry of FuzzReader.
type fuzzSeed struct {
	name                  string
	data                  []byte
	maxFrame, split, step uint16
}

// fuzzSeeds builds the committed corpus: valid streams split at every byte
// boundary and read a byte at a time, and the hostile frames of
// TestReadFrameHostile under small caps.
func fuzzSeeds(t testing.TB) []fuzzSeed {
	ping := frameOf(mustMarshal(t, &iop.Envelope{Kind: &iop.Envelope_Ping{Ping: &iop.HeartbeatPing{Nonce: 7}}}))
	cancel := frameOf(mustMarshal(t, &iop.Envelope{RunId: "r1", Kind: &iop.Envelope_CancelRequest{CancelRequest: &iop.CancelRequest{Reason: "x"}}}))
	body := frameOf(mustMarshal(t, tunnelBody("r1", 1, 20, 'b')))
	stream := slices.Concat(ping, cancel)
	unknown := frameOf(protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), []byte{0x08, 0x01}))
	const small = 255 // maxFrame 255 → cap 256 bytes
	seeds := []fuzzSeed{
		{"zero-length", header(0), small, 0, 0},
		{"huge-length", append(header(^uint32(0)), "xyz"...), small, 0, 0},
		{"huge-length-max-cap", append(header(^uint32(0)), "xyz"...), 65535, 0, 1},
		{"cap-plus-one", frameOf(bytes.Repeat([]byte{0x72, 0}, 129)[:small+2]), small, 0, 0},
		{"cap-exactly", frameOf(bytes.Repeat([]byte{0x72, 0}, (small+1)/2)), small, 0, 0},
		{"truncated-header-1", []byte{0}, small, 0, 0},
		{"truncated-header-3", []byte{0, 0, 1}, small, 0, 0},
		{"truncated-body", body[:len(body)-3], small, 0, 0},
		{"invalid-protobuf", frameOf([]byte{0x0a, 0x05, 'a'}), small, 0, 0},
		{"unknown-kind-99", slices.Concat(unknown, ping), small, 0, 0},
		{"tunnel-body-one-byte-reads", slices.Concat(body, ping), small, 0, 1},
		{"tunnel-body-eof-with-data", slices.Concat(body, cancel), small, 0, 0x8003},
		{"stream-then-garbage", slices.Concat(stream, []byte{0xff, 0xff}), small, 0, 0},
	}
	for at := 1; at < len(stream); at++ {
		seeds = append(seeds, fuzzSeed{fmt.Sprintf("split-%03d", at), stream, small, uint16(at), 0})
	}
	return seeds
}

// corpusFile encodes a seed in the "go test fuzz v1" format.
func corpusFile(s fuzzSeed) []byte {
	return fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\nuint16(%d)\nuint16(%d)\nuint16(%d)\n", s.data, s.maxFrame, s.split, s.step)
}

// TestFuzzSeeds keeps testdata/fuzz/FuzzReader equal to fuzzSeeds; run with
// -update to rewrite it. It also checks the split seeds really cover every
// byte boundary of the stream (SPEC W1).
func TestFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzReader")
	seeds := fuzzSeeds(t)
	if *updateSeeds {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range seeds {
			if err := os.WriteFile(filepath.Join(dir, s.name), corpusFile(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Other files in dir are inputs the fuzzer found failing: kept as
	// regression cases, not checked here.
	splits := 0
	for _, s := range seeds {
		got, err := os.ReadFile(filepath.Join(dir, s.name))
		if err != nil || !bytes.Equal(got, corpusFile(s)) {
			t.Errorf("W1 seed %s is missing or stale (%v); run go test ./internal/wire -run TestFuzzSeeds -update", s.name, err)
		}
		if strings.HasPrefix(s.name, "split-") {
			splits++
		}
	}
	if stream := seeds[len(seeds)-1].data; splits != len(stream)-1 {
		t.Errorf("W1 split seeds: got %d, want one per inner boundary of the %d-byte stream", splits, len(stream))
	}
}
