package rawserver

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Handlers for Start that speak just enough of each store's protocol to get
// past the client's first steps and then send what a hostile server would.

// Hostile Redis payloads: reply headers that announce more than the bytes
// that follow. A client that allocates what is announced pays for each.
const (
	// RedisMapAndBulk is a RESP3 map of 1<<20 pairs, then a 4 MiB bulk.
	RedisMapAndBulk = "%1048576\r\n$4194304\r\n"
	// RedisLongArray is a RESP2 array of 1<<20 elements.
	RedisLongArray = "*1048576\r\n"
	// RedisArrayOfBulks is an array of 1<<16 elements whose first is a
	// 1 MiB bulk.
	RedisArrayOfBulks = "*65536\r\n$1048576\r\n"
)

// Repeat answers every read of the client with payload.
func Repeat(payload string) func(c net.Conn) {
	return func(c net.Conn) {
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			if _, err := c.Write([]byte(payload)); err != nil {
				return
			}
		}
	}
}

// PostgresAnnouncing answers the client's startup message with the 5-byte
// header of an authentication request whose length is declared (it counts
// itself) and whose body never comes; it holds the connection until the
// client drops it.
func PostgresAnnouncing(declared uint32) func(c net.Conn) {
	return func(c net.Conn) {
		var n [4]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(n[:]))-4); err != nil {
			return
		}
		hdr := []byte{'R', 0, 0, 0, 0}
		binary.BigEndian.PutUint32(hdr[1:], declared)
		_, _ = c.Write(hdr)
		_, _ = io.Copy(io.Discard, c)
	}
}

// ReadZKConnectRequest reads a ZooKeeper client's first packet
// (length-prefixed).
func ReadZKConnectRequest(c net.Conn) error {
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return err
	}
	_, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(n[:])))
	return err
}

// ZKPacket is a length-prefixed ZooKeeper packet of the given parts.
func ZKPacket(parts ...[]byte) []byte {
	body := bytes.Join(parts, nil)
	out := binary.BigEndian.AppendUint32(nil, uint32(len(body))) //nolint:gosec // G115: test packets are far below 4 GiB
	return append(out, body...)
}

// ZKConnectResponse is a connect response granting session 1 for
// timeoutMillis with a password whose declared length is passwdLen and whose
// bytes are 16 zeros.
func ZKConnectResponse(timeoutMillis, passwdLen uint32) []byte {
	return ZKPacket(be32(0), be32(timeoutMillis), be64(1), be32(passwdLen), make([]byte, 16))
}

// ZKReplyHeader is a reply header: xid, zxid 1 and the error code.
func ZKReplyHeader(xid int32, errCode uint32) []byte {
	return append(append(be32(uint32(xid)), be64(1)...), be32(errCode)...) //nolint:gosec // G115: the wire's two's complement int32
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// ZooKeeper speaks ZooKeeper's framing: it sends connect for the connect
// response, then answers every request with its header and reply(opcode)
// (pings, whose xid is negative, with the header alone).
func ZooKeeper(connect []byte, reply func(op int32) []byte) func(c net.Conn) {
	return func(c net.Conn) {
		if ReadZKConnectRequest(c) != nil {
			return
		}
		if _, err := c.Write(connect); err != nil {
			return
		}
		for {
			var n [4]byte
			if _, err := io.ReadFull(c, n[:]); err != nil {
				return
			}
			body := make([]byte, binary.BigEndian.Uint32(n[:]))
			if _, err := io.ReadFull(c, body); err != nil || len(body) < 8 {
				return
			}
			xid, op := int32(binary.BigEndian.Uint32(body)), int32(binary.BigEndian.Uint32(body[4:])) //nolint:gosec // G115: the wire's two's complement int32
			var out []byte
			if xid >= 0 {
				out = reply(op)
			}
			if _, err := c.Write(ZKPacket(ZKReplyHeader(xid, 0), out)); err != nil {
				return
			}
		}
	}
}

// GRPCAnnouncing1GiB is a gRPC message prefix announcing 1 GiB.
var GRPCAnnouncing1GiB = []byte{0, 0x40, 0, 0, 0}

// GRPC speaks just enough HTTP/2 to answer every gRPC call with response
// headers, padded by n headers of pad bytes each (sent in 16 KiB frames),
// then data, if any. When advertised is not nil, it receives the header
// list size the client advertises in its settings, if any.
func GRPC(pad, n int, data []byte, advertised chan<- uint32) func(c net.Conn) {
	return func(c net.Conn) {
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
			return
		}
		fr := http2.NewFramer(c, c)
		if fr.WriteSettings() != nil {
			return
		}
		var hdr bytes.Buffer
		enc := hpack.NewEncoder(&hdr)
		fields := []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"}}
		for i := range n {
			fields = append(fields, hpack.HeaderField{Name: fmt.Sprintf("x-pad-%d", i), Value: strings.Repeat("a", pad)})
		}
		for _, f := range fields {
			_ = enc.WriteField(f)
		}
		block := hdr.Bytes()
		const frame = 16 << 10
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if f.IsAck() {
					break
				}
				if v, ok := f.Value(http2.SettingMaxHeaderListSize); ok && advertised != nil {
					select {
					case advertised <- v:
					default:
					}
				}
				if fr.WriteSettingsAck() != nil {
					return
				}
			case *http2.PingFrame:
				if !f.IsAck() && fr.WritePing(true, f.Data) != nil {
					return
				}
			case *http2.HeadersFrame: // a call: answer at once
				id := f.StreamID
				first := block[:min(frame, len(block))]
				if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(block) <= frame}) != nil {
					return
				}
				for rest := block[len(first):]; len(rest) > 0; {
					part := rest[:min(frame, len(rest))]
					rest = rest[len(part):]
					if fr.WriteContinuation(id, len(rest) == 0, part) != nil {
						return
					}
				}
				if data != nil && fr.WriteData(id, false, data) != nil {
					return
				}
			}
		}
	}
}
