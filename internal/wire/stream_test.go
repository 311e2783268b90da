package wire

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"testing/iotest"
	"time"

	"iop/internal/leakcheck"
	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// smallStream returns a few frames of different kinds and sizes, and the
// envelopes they carry.
func smallStream(t testing.TB) ([]byte, []*iop.Envelope) {
	t.Helper()
	rows := kindRows()
	envs := []*iop.Envelope{
		rows["ping"],
		tunnelBody("run-2", 1, 40, 'z'),
		rows["cancel_request"],
		rows["ready_response"],
	}
	var stream bytes.Buffer
	w := NewWriter(&stream, 0)
	for _, env := range envs {
		if err := w.WriteEnvelope(env); err != nil {
			t.Fatal(err)
		}
	}
	return stream.Bytes(), envs
}

// readAll reads envelopes until an error and returns them with that error.
func readAll(src io.Reader) ([]*iop.Envelope, error) { return readAllFrom(NewReader(src, 0)) }

func sameEnvelopes(got, want []*iop.Envelope) error {
	if len(got) != len(want) {
		return fmt.Errorf("got %d envelopes, want %d", len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			return fmt.Errorf("envelope %d: got %v, want %v", i, got[i], want[i])
		}
	}
	return nil
}

// TestSplitAtEveryByte: the same envelopes come out however the stream is cut
// into reads (SPEC W1).
func TestSplitAtEveryByte(t *testing.T) {
	stream, want := smallStream(t)
	for at := 0; at <= len(stream); at++ {
		got, err := readAll(io.MultiReader(bytes.NewReader(stream[:at]), bytes.NewReader(stream[at:])))
		if err != io.EOF {
			t.Errorf("W1 split at byte %d: ended with %v, want io.EOF", at, err)
		}
		if e := sameEnvelopes(got, want); e != nil {
			t.Errorf("W1 split at byte %d: %v", at, e)
		}
	}
	readers := []struct {
		name string
		r    io.Reader
	}{
		{"W1 one byte per Read", iotest.OneByteReader(bytes.NewReader(stream))},
		{"W1 half of each Read", iotest.HalfReader(bytes.NewReader(stream))},
		{"W1 EOF returned with the last data", iotest.DataErrReader(iotest.OneByteReader(bytes.NewReader(stream)))},
		{"W1 behind a 16-byte bufio.Reader", bufio.NewReaderSize(iotest.OneByteReader(bytes.NewReader(stream)), 16)},
	}
	for _, tc := range readers {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readAll(tc.r)
			if err != io.EOF {
				t.Errorf("ended with %v, want io.EOF", err)
			}
			if e := sameEnvelopes(got, want); e != nil {
				t.Error(e)
			}
		})
	}
}

// TestTruncatedAtEveryByte: a stream cut anywhere yields the whole frames
// before the cut, then io.EOF on a frame boundary or ErrTruncated inside a
// frame (SPEC W1).
func TestTruncatedAtEveryByte(t *testing.T) {
	stream, want := smallStream(t)
	var ends []int // offset just after each frame
	for off := 0; off < len(stream); {
		off += HeaderSize + int(uint32(stream[off])<<24|uint32(stream[off+1])<<16|uint32(stream[off+2])<<8|uint32(stream[off+3]))
		ends = append(ends, off)
	}
	for cut := 0; cut <= len(stream); cut++ {
		whole, boundary := 0, cut == 0
		for _, end := range ends {
			if end <= cut {
				whole++
			}
			boundary = boundary || end == cut
		}
		got, err := readAll(iotest.OneByteReader(bytes.NewReader(stream[:cut])))
		wantErr := ErrTruncated
		if boundary {
			wantErr = io.EOF
		}
		if !errors.Is(err, wantErr) {
			t.Errorf("W1 cut at byte %d: ended with %v, want %v", cut, err, wantErr)
		}
		if e := sameEnvelopes(got, want[:whole]); e != nil {
			t.Errorf("W1 cut at byte %d: %v", cut, e)
		}
	}
}

// TestLoopbackTCP runs frames over a real loopback TCP connection, where
// reads return whatever the kernel has (SPEC W1).
func TestLoopbackTCP(t *testing.T) {
	t.Run("W1 echo of mixed sizes", func(t *testing.T) {
		leakcheck.Check(t)
		client, server := tcpPair(t)
		serverDone := make(chan error, 1)
		go func() { // echo server: owns server's reads and writes
			r := NewReader(bufio.NewReader(server), 0)
			r.SetMaxFrame(DefaultMaxFrame) // as after ready
			w := NewWriter(server, 0)
			for {
				body, err := r.ReadFrame()
				if err == io.EOF {
					serverDone <- server.(*net.TCPConn).CloseWrite()
					return
				}
				if err == nil {
					err = w.WriteFrame(body)
				}
				if err != nil {
					serverDone <- err
					return
				}
			}
		}()
		var want []*iop.Envelope
		for _, env := range kindRows() {
			want = append(want, env)
		}
		for i, size := range []int{1, 255, 32 << 10, 70 << 10, 3 << 20} {
			want = append(want, tunnelBody("run-tcp", uint64(i+1), size, byte('a'+i)))
		}
		clientDone := make(chan error, 1)
		go func() { // client writer: owns client's write side
			w := NewWriter(client, 0)
			for _, env := range want {
				if err := w.WriteEnvelope(env); err != nil {
					clientDone <- err
					return
				}
			}
			clientDone <- client.(*net.TCPConn).CloseWrite()
		}()
		r := NewReader(client, DefaultMaxFrame) // unbuffered: short reads
		got, err := readAllFrom(r)
		if err != io.EOF {
			t.Errorf("echo ended with %v, want io.EOF", err)
		}
		if e := sameEnvelopes(got, want); e != nil {
			t.Error(e)
		}
		for name, ch := range map[string]chan error{"client writer": clientDone, "echo server": serverDone} {
			if err := waitErr(t, ch); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	})

	t.Run("W1 oversized length rejected before any body byte", func(t *testing.T) {
		leakcheck.Check(t)
		client, server := tcpPair(t)
		writeDone := make(chan error, 1)
		go func() {
			_, err := client.Write(append(header(^uint32(0)), "body bytes that must stay unread"...))
			writeDone <- err
		}()
		src := &countingReader{r: server}
		_, err := NewReader(src, 0).ReadFrame()
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Errorf("err: got %v, want %v", err, ErrFrameTooLarge)
		}
		if src.read != HeaderSize {
			t.Errorf("consumed %d bytes, want the %d-byte header only", src.read, HeaderSize)
		}
		if err := waitErr(t, writeDone); err != nil {
			t.Errorf("client write: %v", err)
		}
	})
}

// readAllFrom reads envelopes from r until an error and returns them with it.
func readAllFrom(r *Reader) ([]*iop.Envelope, error) {
	var out []*iop.Envelope
	for {
		env := &iop.Envelope{}
		if err := r.ReadEnvelope(env); err != nil {
			return out, err
		}
		out = append(out, env)
	}
}

// tcpPair returns both ends of a loopback TCP connection with a 10 s
// deadline, closed when the test ends.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		client.Close()
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range []net.Conn{client, server} {
		if err := c.SetDeadline(deadline); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	return client, server
}

// waitErr waits for a goroutine's result, failing the test after 10 s.
func waitErr(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("goroutine did not finish within 10 s")
		return nil
	}
}
