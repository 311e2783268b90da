package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"strconv"
	"testing"

	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// header returns a 4-byte big-endian length prefix.
func header(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

// frameOf returns header(len(body)) followed by body.
func frameOf(body []byte) []byte { return append(header(uint32(len(body))), body...) }

// tunnelBody is the realistic bulk payload: a ProviderTunnelFrame BODY
// carrying size bytes of upstream body.
func tunnelBody(runID string, seq uint64, size int, fill byte) *iop.Envelope {
	return &iop.Envelope{
		RunId: runID,
		Kind: &iop.Envelope_TunnelFrame{TunnelFrame: &iop.ProviderTunnelFrame{
			Seq:  seq,
			Kind: iop.TunnelFrameKind_TUNNEL_FRAME_BODY,
			Body: bytes.Repeat([]byte{fill}, size),
		}},
	}
}

// envelopeOfSize returns a tunnel BODY envelope whose serialized size is
// exactly n bytes.
func envelopeOfSize(t testing.TB, n int) *iop.Envelope {
	t.Helper()
	for k := n; k >= 0; k-- {
		env := tunnelBody("r", 1, k, 'x')
		if proto.Size(env) == n {
			return env
		}
	}
	t.Fatalf("no tunnel envelope serializes to %d bytes", n)
	return nil
}

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return b
}

// countingReader counts the bytes its callers consumed.
type countingReader struct {
	r    io.Reader
	read int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += n
	return n, err
}

// repeatReader serves the same bytes forever without allocating.
type repeatReader struct {
	data []byte
	off  int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.data[r.off:])
		n += c
		r.off = (r.off + c) % len(r.data)
	}
	return n, nil
}

// TestReadFrameHostile feeds hostile and edge-case streams to ReadFrame.
func TestReadFrameHostile(t *testing.T) {
	body := func(n int) []byte { return bytes.Repeat([]byte{'b'}, n) }
	const pre, post = DefaultPreReadyCap, DefaultMaxFrame
	tests := []struct {
		name     string
		maxFrame int // 0 = NewReader's default (pre-ready)
		input    []byte
		wantErr  error  // nil = a body of wantBody bytes
		wantLen  uint32 // FrameError.Length when wantErr is a frame error
		wantBody int
		consumed int // bytes ReadFrame may take from the stream
	}{
		{name: "W1 length 2^32-1 pre-ready", input: append(header(^uint32(0)), body(64)...),
			wantErr: ErrFrameTooLarge, wantLen: ^uint32(0), consumed: HeaderSize},
		{name: "W1 length 2^32-1 post-ready", maxFrame: post, input: append(header(^uint32(0)), body(64)...),
			wantErr: ErrFrameTooLarge, wantLen: ^uint32(0), consumed: HeaderSize},
		{name: "W1 cap+1 pre-ready", input: frameOf(body(pre + 1)),
			wantErr: ErrFrameTooLarge, wantLen: pre + 1, consumed: HeaderSize},
		{name: "W1 cap exactly pre-ready accepted", input: frameOf(body(pre)),
			wantBody: pre, consumed: HeaderSize + pre},
		{name: "W1 cap+1 post-ready", maxFrame: post, input: append(header(post+1), body(64)...),
			wantErr: ErrFrameTooLarge, wantLen: post + 1, consumed: HeaderSize},
		{name: "W1 cap exactly post-ready accepted", maxFrame: post, input: frameOf(body(post)),
			wantBody: post, consumed: HeaderSize + post},
		{name: "W1 small cap+1", maxFrame: 10, input: frameOf(body(11)),
			wantErr: ErrFrameTooLarge, wantLen: 11, consumed: HeaderSize},
		{name: "W1 length 0", input: append(header(0), body(8)...),
			wantErr: ErrEmptyFrame, wantLen: 0, consumed: HeaderSize},
		{name: "W1 truncated header 1 byte", input: []byte{0},
			wantErr: ErrTruncated, consumed: 1},
		{name: "W1 truncated header 2 bytes", input: []byte{0, 0},
			wantErr: ErrTruncated, consumed: 2},
		{name: "W1 truncated header 3 bytes", input: []byte{0, 0, 1},
			wantErr: ErrTruncated, consumed: 3},
		{name: "W1 truncated body", input: append(header(10), body(5)...),
			wantErr: ErrTruncated, wantLen: 10, consumed: HeaderSize + 5},
		{name: "W1 header without body", input: header(10),
			wantErr: ErrTruncated, wantLen: 10, consumed: HeaderSize},
		{name: "W1 clean EOF between frames", input: nil,
			wantErr: io.EOF, consumed: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := &countingReader{r: bytes.NewReader(tc.input)}
			r := NewReader(src, tc.maxFrame)
			got, err := r.ReadFrame()
			if src.read != tc.consumed {
				t.Errorf("consumed %d bytes of the stream, want %d", src.read, tc.consumed)
			}
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("ReadFrame: %v, want a %d-byte body", err, tc.wantBody)
				}
				if !bytes.Equal(got, tc.input[HeaderSize:]) {
					t.Errorf("body: got %d bytes, want %d", len(got), tc.wantBody)
				}
				return
			}
			if got != nil {
				t.Errorf("body: got %d bytes, want nil", len(got))
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err: got %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr == io.EOF {
				if err != io.EOF {
					t.Errorf("err: got %#v, want bare io.EOF", err)
				}
				return
			}
			var fe *FrameError
			if !errors.As(err, &fe) {
				t.Fatalf("err: got %T, want *FrameError", err)
			}
			if fe.Length != tc.wantLen || fe.Cap != uint32(r.MaxFrame()) {
				t.Errorf("FrameError: got length %d cap %d, want length %d cap %d", fe.Length, fe.Cap, tc.wantLen, r.MaxFrame())
			}
			if tc.wantErr != ErrTruncated && cap(r.buf) != 0 {
				t.Errorf("body buffer grew to %d bytes for a rejected length", cap(r.buf))
			}
		})
	}
}

// TestOversizeLengthAllocatesNothing proves W1's "nothing of that size is
// allocated": rejecting a length costs one small error value, in count and in
// bytes, however large the length.
func TestOversizeLengthAllocatesNothing(t *testing.T) {
	tests := []struct {
		name     string
		maxFrame int
		length   uint32
		want     error
	}{
		{"W1 length 2^32-1 pre-ready", 0, ^uint32(0), ErrFrameTooLarge},
		{"W1 length 2^32-1 post-ready", DefaultMaxFrame, ^uint32(0), ErrFrameTooLarge},
		{"W1 cap+1 pre-ready", 0, DefaultPreReadyCap + 1, ErrFrameTooLarge},
		{"W1 cap+1 post-ready", DefaultMaxFrame, DefaultMaxFrame + 1, ErrFrameTooLarge},
		{"W1 length 0", 0, 0, ErrEmptyFrame},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(&repeatReader{data: header(tc.length)}, tc.maxFrame)
			var err error
			read := func() { _, err = r.ReadFrame() }
			const runs = 10
			if perRun := allocatedBytes(runs, read) / runs; perRun >= 1024 {
				t.Fatalf("bytes allocated per rejected %d-byte length: got %d, want < 1024", tc.length, perRun)
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("err: got %v, want %v", err, tc.want)
			}
			if allocs := testing.AllocsPerRun(100, read); allocs > 1 {
				t.Errorf("allocations per rejected frame: got %v, want ≤ 1 (the *FrameError)", allocs)
			}
		})
	}
}

// TestDeclaredLengthMemoryFollowsData: within the cap, a peer that declares
// 16 MiB and then sends a few bytes costs about growStep bytes, not 16 MiB.
func TestDeclaredLengthMemoryFollowsData(t *testing.T) {
	input := append(header(DefaultMaxFrame), []byte("only ten b")...)
	var err error
	got := allocatedBytes(1, func() {
		_, err = NewReader(bytes.NewReader(input), DefaultMaxFrame).ReadFrame()
	})
	if !errors.Is(err, ErrTruncated) {
		t.Fatalf("err: got %v, want %v", err, ErrTruncated)
	}
	if got > 2*growStep {
		t.Errorf("W1 bytes allocated for a 16 MiB length with 10 body bytes: got %d, want ≤ %d", got, 2*growStep)
	}
}

// allocatedBytes returns the heap bytes allocated while running f runs times.
func allocatedBytes(runs int, f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestReadFrameSteadyStateAllocs: reading frames no larger than an earlier
// one reuses the body buffer (the framer's target: ≤ 1 allocation per frame, BENCHMARKS.md "Framer").
func TestReadFrameSteadyStateAllocs(t *testing.T) {
	for _, size := range []int{256, 32 << 10, 256 << 10} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			r := NewReader(&repeatReader{data: frameOf(bytes.Repeat([]byte{'b'}, size))}, DefaultMaxFrame)
			if _, err := r.ReadFrame(); err != nil { // warm the buffer
				t.Fatal(err)
			}
			allocs := testing.AllocsPerRun(50, func() {
				if b, err := r.ReadFrame(); err != nil || len(b) != size {
					t.Fatalf("ReadFrame: %d bytes, %v", len(b), err)
				}
			})
			if allocs > 1 {
				t.Errorf("allocations per %d-byte frame: got %v, want ≤ 1", size, allocs)
			}
		})
	}
}

// TestReadFrameLargeBody: bodies above growStep arrive intact through the
// growing buffer, and buffers above retainMax are not kept.
func TestReadFrameLargeBody(t *testing.T) {
	for _, size := range []int{growStep + 1, 3*growStep + 7, retainMax, retainMax + 1, 3 << 20} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			want := make([]byte, size)
			for i := range want {
				want[i] = byte(i * 7)
			}
			r := NewReader(bytes.NewReader(frameOf(want)), DefaultMaxFrame)
			got, err := r.ReadFrame()
			if err != nil {
				t.Fatalf("ReadFrame: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("W1 body of %d bytes corrupted", size)
			}
			if retained := cap(r.buf); retained > retainMax {
				t.Errorf("retained a %d-byte buffer, want ≤ %d", retained, retainMax)
			}
		})
	}
}

// TestReaderCaps: 64 KiB until ready, 16 MiB after, moved by SetMaxFrame
// (SPEC W1; docs/wire.md, "Timeouts and bounds").
func TestReaderCaps(t *testing.T) {
	over := frameOf(bytes.Repeat([]byte{'b'}, DefaultPreReadyCap+1))
	tests := []struct {
		name    string
		set     func(r *Reader)
		wantCap int
		wantErr error // reading a 64 KiB + 1 frame
	}{
		{"W1 pre-ready default 64 KiB", func(*Reader) {}, DefaultPreReadyCap, ErrFrameTooLarge},
		{"W1 post-ready SetMaxFrame 16 MiB", func(r *Reader) { r.SetMaxFrame(DefaultMaxFrame) }, DefaultMaxFrame, nil},
		{"W1 SetMaxFrame 0 means pre-ready default", func(r *Reader) { r.SetMaxFrame(0) }, DefaultPreReadyCap, ErrFrameTooLarge},
		{"W1 SetMaxFrame negative means pre-ready default", func(r *Reader) { r.SetMaxFrame(-1) }, DefaultPreReadyCap, ErrFrameTooLarge},
		{"W1 SetMaxFrame smaller", func(r *Reader) { r.SetMaxFrame(100) }, 100, ErrFrameTooLarge},
	}
	if strconv.IntSize == 64 {
		tests = append(tests, struct {
			name    string
			set     func(r *Reader)
			wantCap int
			wantErr error
		}{"W1 SetMaxFrame above 2^32-1 clamps", func(r *Reader) { r.SetMaxFrame(1 << 40) }, 1<<32 - 1, nil})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(over), 0)
			tc.set(r)
			if r.MaxFrame() != tc.wantCap {
				t.Errorf("MaxFrame: got %d, want %d", r.MaxFrame(), tc.wantCap)
			}
			_, err := r.ReadFrame()
			if !errors.Is(err, tc.wantErr) { // errors.Is(nil, nil) is true
				t.Errorf("reading a %d-byte frame: got %v, want %v", len(over)-HeaderSize, err, tc.wantErr)
			}
		})
	}

	t.Run("W1 cap change applies to the next frame", func(t *testing.T) {
		stream := append(frameOf(bytes.Repeat([]byte{'a'}, 100)), frameOf(bytes.Repeat([]byte{'b'}, 100))...)
		r := NewReader(bytes.NewReader(stream), 200)
		if _, err := r.ReadFrame(); err != nil {
			t.Fatalf("first frame under cap 200: %v", err)
		}
		r.SetMaxFrame(50)
		if _, err := r.ReadFrame(); !errors.Is(err, ErrFrameTooLarge) {
			t.Errorf("second frame under cap 50: got %v, want %v", err, ErrFrameTooLarge)
		}
	})
}

// TestReadEnvelopeMalformed: invalid protobuf bodies are a *FrameError
// wrapping ErrMalformed, with the frame length and the cap (SPEC W5).
func TestReadEnvelopeMalformed(t *testing.T) {
	tests := []struct {
		name string
		body []byte
	}{
		{"W5 truncated varint", []byte{0x08, 0x80}},
		{"W5 length-delimited past the end", []byte{0x0a, 0x05, 'a'}},
		{"W5 field number 0", []byte{0x02, 0x00}},
		{"W5 wire type 7", []byte{0x0f, 0x00}},
		{"W5 unmatched end group", []byte{0x0c}},
		{"W5 run_id not UTF-8", []byte{0x0a, 0x01, 0xff}},
		{"W5 tunnel frame with a truncated nested message", []byte{0x9a, 0x01, 0x03, 0x08, 0x01, 0x2a}},
		{"W5 random bytes", []byte("\xde\xad\xbe\xef\xff\xff\xff\xff\xff")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(frameOf(tc.body)), 1000)
			env := &iop.Envelope{RunId: "stale"}
			err := r.ReadEnvelope(env)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("err: got %v, want %v", err, ErrMalformed)
			}
			if errors.Is(err, ErrNoPayload) {
				t.Errorf("err %v also matches ErrNoPayload; malformed must be fatal", err)
			}
			var fe *FrameError
			if !errors.As(err, &fe) || fe.Length != uint32(len(tc.body)) || fe.Cap != 1000 {
				t.Errorf("err: got %#v, want *FrameError length %d cap 1000", err, len(tc.body))
			}
		})
	}
}

// TestUnknownKind: an Envelope whose payload this build does not know (a
// field number from a newer peer) is decoded and reported with ErrNoPayload,
// which is not fatal: the next frame reads normally (SPEC W5, W2).
func TestUnknownKind(t *testing.T) {
	runID := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "run-7")
	inner := mustMarshal(t, &iop.HeartbeatPing{Nonce: 9})
	tests := []struct {
		name        string
		body        []byte
		wantUnknown bool
	}{
		{"W5 field 99 length-delimited", append(runID, protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), inner)...), true},
		{"W5 field 99 varint", append(runID, protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5)...), true},
		{"W5 field 99 fixed32", append(runID, protowire.AppendFixed32(protowire.AppendTag(nil, 99, protowire.Fixed32Type), 5)...), true},
		{"W5 field 536870911 (max) length-delimited", append(runID, protowire.AppendBytes(protowire.AppendTag(nil, protowire.MaxValidNumber, protowire.BytesType), nil)...), true},
		{"W2 ids only, no payload", runID, false},
	}
	next := mustMarshal(t, &iop.Envelope{RunId: "run-8", Kind: &iop.Envelope_Pong{Pong: &iop.HeartbeatPong{Nonce: 9}}})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(append(frameOf(tc.body), frameOf(next)...)), 0)
			var env iop.Envelope
			err := r.ReadEnvelope(&env)
			if !errors.Is(err, ErrNoPayload) {
				t.Fatalf("err: got %v, want %v", err, ErrNoPayload)
			}
			var fe *FrameError
			if errors.Is(err, ErrMalformed) || errors.As(err, &fe) {
				t.Errorf("err: got %v, want a non-fatal ErrNoPayload, not a frame error", err)
			}
			if env.GetRunId() != "run-7" {
				t.Errorf("run_id: got %q, want %q (the envelope is still decoded)", env.GetRunId(), "run-7")
			}
			if got := len(env.ProtoReflect().GetUnknown()) > 0; got != tc.wantUnknown {
				t.Errorf("unknown fields kept: got %v, want %v", got, tc.wantUnknown)
			}
			if err := r.ReadEnvelope(&env); err != nil || env.GetPong().GetNonce() != 9 || env.GetRunId() != "run-8" {
				t.Errorf("next frame after an unknown kind: got %v %v, want the pong of run-8", &env, err)
			}
		})
	}
}

// TestDecodeCopies: a decoded Envelope stays valid after the Reader reuses
// its buffer for the next frame (ReadEnvelope's contract).
func TestDecodeCopies(t *testing.T) {
	a := tunnelBody("run-a", 1, 300, 'a')
	b := tunnelBody("run-b", 2, 300, 'b')
	stream := append(frameOf(mustMarshal(t, a)), frameOf(mustMarshal(t, b))...)
	r := NewReader(bytes.NewReader(stream), 0)
	var first, second iop.Envelope
	if err := r.ReadEnvelope(&first); err != nil {
		t.Fatal(err)
	}
	if err := r.ReadEnvelope(&second); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&first, a) || !proto.Equal(&second, b) {
		t.Errorf("W1 first envelope changed after the next read: got run %q body[0] %q", first.GetRunId(), first.GetTunnelFrame().GetBody()[:1])
	}
}

// TestFrameErrorMessage: messages say what was wrong and the sizes involved.
func TestFrameErrorMessage(t *testing.T) {
	tests := []struct {
		name string
		err  *FrameError
		want string
	}{
		{"W1 over cap", &FrameError{Length: 70000, Cap: 65536, Err: ErrFrameTooLarge}, "wire: frame length over cap (length 70000 bytes, cap 65536 bytes)"},
		{"W1 truncated header", &FrameError{Cap: 65536, Err: ErrTruncated}, "wire: truncated frame (inside the 4-byte header)"},
		{"W5 malformed without cap", &FrameError{Length: 3, Err: ErrMalformed}, "wire: malformed envelope (length 3 bytes)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
