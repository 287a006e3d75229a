#!/usr/bin/env python3
"""A logging TCP proxy for the PostgreSQL wire protocol (v3).

    python pgwire_tap.py --listen 127.0.0.1:6543 --upstream 127.0.0.1:5432 --log tap.log

Clients connect to --listen; every byte is forwarded unchanged to --upstream and back, and each
protocol message in either direction is decoded into one line of --log (or stderr):

    c3 F Parse stmt='_pg3_0' query='SELECT ...' param_oids=[25]
    c3 F Bind portal='' stmt='_pg3_0' param_formats=[0] params=['vector'] result_formats=[1]
    c3 B RowDescription [typname(oid=19 fmt=1 table=1247 attnum=2 len=64 mod=-1), ...]

`F` is frontend (client to server), `B` backend. It was written to record exactly what psql,
psycopg and asyncpg send to a server (tests/pg_clients/CAPTURED.md) and is handy for comparing
`fragvec serve` with PostgreSQL byte for byte. It decodes cleartext only: a client that asks for
TLS (SSLRequest) gets the server's answer, and a server that says 'S' makes the rest opaque, so
run clients with sslmode=disable (or against a server without TLS). Standard library only.
"""

import argparse
import itertools
import socket
import struct
import sys
import threading

_lock = threading.Lock()
_out = sys.stderr
_ids = itertools.count(1)
_max_value = 200


def log(line):
    with _lock:
        _out.write(line + "\n")
        _out.flush()


def show(value):
    """A parameter or column value, shortened."""
    if value is None:
        return "NULL"
    try:
        text = value.decode("utf-8")
        printable = all(ch.isprintable() or ch in "\n\t" for ch in text)
    except UnicodeDecodeError:
        printable = False
    if printable:
        return repr(text if len(text) <= _max_value else text[:_max_value] + "...")
    return "0x" + value[:_max_value].hex() + ("..." if len(value) > _max_value else "")


class Reader:
    def __init__(self, body):
        self.b = body
        self.i = 0

    def cstr(self):
        j = self.b.index(b"\0", self.i)
        s = self.b[self.i : j].decode("utf-8", "replace")
        self.i = j + 1
        return s

    def i16(self):
        (v,) = struct.unpack_from(">h", self.b, self.i)
        self.i += 2
        return v

    def i32(self):
        (v,) = struct.unpack_from(">i", self.b, self.i)
        self.i += 4
        return v

    def u32(self):
        (v,) = struct.unpack_from(">I", self.b, self.i)
        self.i += 4
        return v

    def bytes(self, n):
        v = self.b[self.i : self.i + n]
        self.i += n
        return v

    def value(self):
        n = self.i32()
        return None if n < 0 else self.bytes(n)

    def rest(self):
        return self.b[self.i :]


def fields(r):
    out = {}
    while True:
        code = r.bytes(1)
        if code in (b"", b"\0"):
            return out
        out[code.decode()] = r.cstr()


def decode_frontend(code, body):
    r = Reader(body)
    if code == b"Q":
        return "Query %r" % r.cstr()
    if code == b"P":
        name, query = r.cstr(), r.cstr()
        oids = [r.u32() for _ in range(r.i16())]
        return "Parse stmt=%r query=%r param_oids=%s" % (name, query, oids)
    if code == b"B":
        portal, stmt = r.cstr(), r.cstr()
        pformats = [r.i16() for _ in range(r.i16())]
        params = [r.value() for _ in range(r.i16())]
        rformats = [r.i16() for _ in range(r.i16())]
        return "Bind portal=%r stmt=%r param_formats=%s params=[%s] result_formats=%s" % (
            portal,
            stmt,
            pformats,
            ", ".join(show(p) for p in params),
            rformats,
        )
    if code == b"D":
        kind = r.bytes(1).decode()
        return "Describe %s %r" % ({"S": "statement", "P": "portal"}.get(kind, kind), r.cstr())
    if code == b"E":
        portal = r.cstr()
        return "Execute portal=%r max_rows=%d" % (portal, r.i32())
    if code == b"C":
        kind = r.bytes(1).decode()
        return "Close %s %r" % ({"S": "statement", "P": "portal"}.get(kind, kind), r.cstr())
    if code == b"S":
        return "Sync"
    if code == b"H":
        return "Flush"
    if code == b"X":
        return "Terminate"
    if code == b"p":
        return "PasswordMessage/SASL (%d bytes)" % len(body)
    if code == b"d":
        return "CopyData %s" % show(body)
    if code == b"c":
        return "CopyDone"
    if code == b"f":
        return "CopyFail %r" % r.cstr()
    if code == b"F":
        return "FunctionCall (%d bytes)" % len(body)
    return "message %r (%d bytes)" % (code, len(body))


AUTH = {0: "Ok", 2: "KerberosV5", 3: "CleartextPassword", 5: "MD5Password", 10: "SASL", 11: "SASLContinue", 12: "SASLFinal"}


def decode_backend(code, body):
    r = Reader(body)
    if code == b"R":
        kind = r.i32()
        extra = ""
        if kind == 10:
            mechs = []
            while r.i < len(body) - 1:
                mechs.append(r.cstr())
            extra = " mechanisms=%s" % mechs
        return "Authentication%s%s" % (AUTH.get(kind, str(kind)), extra)
    if code == b"S":
        return "ParameterStatus %s=%r" % (r.cstr(), r.cstr())
    if code == b"K":
        return "BackendKeyData pid=%d" % r.i32()
    if code == b"Z":
        return "ReadyForQuery %s" % r.bytes(1).decode()
    if code == b"T":
        cols = []
        for _ in range(r.i16()):
            name = r.cstr()
            table, attnum, oid, size, mod, fmt = r.u32(), r.i16(), r.u32(), r.i16(), r.i32(), r.i16()
            cols.append("%s(oid=%d fmt=%d table=%d attnum=%d len=%d mod=%d)" % (name, oid, fmt, table, attnum, size, mod))
        return "RowDescription [%s]" % ", ".join(cols)
    if code == b"t":
        return "ParameterDescription %s" % [r.u32() for _ in range(r.i16())]
    if code == b"D":
        return "DataRow [%s]" % ", ".join(show(r.value()) for _ in range(r.i16()))
    if code == b"C":
        return "CommandComplete %r" % r.cstr()
    if code in (b"E", b"N"):
        f = fields(r)
        return "%s %s %s: %s" % ("ErrorResponse" if code == b"E" else "NoticeResponse", f.get("S"), f.get("C"), f.get("M"))
    if code in (b"G", b"H", b"W"):
        overall = r.bytes(1)[0]
        cols = [r.i16() for _ in range(r.i16())]
        name = {b"G": "CopyInResponse", b"H": "CopyOutResponse", b"W": "CopyBothResponse"}[code]
        return "%s format=%d column_formats=%s" % (name, overall, cols)
    if code == b"d":
        return "CopyData %s" % show(body)
    if code == b"c":
        return "CopyDone"
    simple = {b"1": "ParseComplete", b"2": "BindComplete", b"3": "CloseComplete", b"n": "NoData", b"s": "PortalSuspended", b"I": "EmptyQueryResponse"}
    if code in simple:
        return simple[code]
    if code == b"A":
        return "NotificationResponse (%d bytes)" % len(body)
    if code == b"v":
        return "NegotiateProtocolVersion (%d bytes)" % len(body)
    return "message %r (%d bytes)" % (code, len(body))


def decode_startup(body):
    r = Reader(body)
    version = r.u32()
    if version == 80877103:
        return "SSLRequest", True
    if version == 80877104:
        return "GSSENCRequest", True
    if version == 80877102:
        pid = r.i32()
        return "CancelRequest pid=%d" % pid, False
    params = {}
    while r.i < len(body) - 1:
        k = r.cstr()
        params[k] = r.cstr()
    return "StartupMessage v%d.%d %s" % (version >> 16, version & 0xFFFF, params), False


class Pump(threading.Thread):
    def __init__(self, cid, side, src, dst, peer):
        super().__init__(daemon=True)
        self.cid, self.side, self.src, self.dst, self.peer = cid, side, src, dst, peer
        self.buf = b""
        self.startup = side == "F"  # the frontend's first message has no type byte
        self.one_byte = 0  # backend answers to SSLRequest/GSSENCRequest are one byte
        self.opaque = False

    def emit(self, text):
        log("c%d %s %s" % (self.cid, self.side, text))

    def parse(self):
        while not self.opaque:
            if self.side == "B" and self.one_byte:
                if not self.buf:
                    return
                answer, self.buf = self.buf[:1], self.buf[1:]
                self.one_byte -= 1
                self.emit("EncryptionResponse %r" % answer.decode())
                if answer != b"N":
                    self.opaque = True
                    self.peer.opaque = True
                    self.emit("(encrypted from here on: not decoded)")
                continue
            if self.startup:
                if len(self.buf) < 4:
                    return
                (n,) = struct.unpack_from(">i", self.buf)
                if n < 8 or n > 10000:
                    self.emit("bad startup length %d; not decoding this connection" % n)
                    self.opaque = True
                    return
                if len(self.buf) < n:
                    return
                body, self.buf = self.buf[4:n], self.buf[n:]
                text, again = decode_startup(body)
                self.emit(text)
                if again:
                    self.peer.one_byte += 1
                else:
                    self.startup = False
                continue
            if len(self.buf) < 5:
                return
            code = self.buf[:1]
            (n,) = struct.unpack_from(">i", self.buf, 1)
            if n < 4:
                self.emit("bad message length %d; not decoding this connection" % n)
                self.opaque = True
                return
            if len(self.buf) < n + 1:
                return
            body, self.buf = self.buf[5 : n + 1], self.buf[n + 1 :]
            try:
                text = (decode_frontend if self.side == "F" else decode_backend)(code, body)
            except Exception as e:  # a message we misread is logged, never fatal
                text = "undecodable %r (%d bytes): %s" % (code, len(body), e)
            self.emit(text)

    def run(self):
        try:
            while True:
                data = self.src.recv(65536)
                if not data:
                    break
                # Decoded (and logged) before it is forwarded, so the log is in causal order.
                if not self.opaque:
                    self.buf += data
                    self.parse()
                self.dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (self.src, self.dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def serve(listen, upstream):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(listen)
    ls.listen(128)
    log("tap: listening on %s:%d, upstream %s:%d" % (listen + upstream))
    while True:
        client, addr = ls.accept()
        cid = next(_ids)
        try:
            server = socket.create_connection(upstream)
        except OSError as e:
            log("c%d upstream connect failed: %s" % (cid, e))
            client.close()
            continue
        log("c%d connect from %s:%d" % (cid, addr[0], addr[1]))
        f = Pump(cid, "F", client, server, None)
        b = Pump(cid, "B", server, client, f)
        f.peer = b
        f.start()
        b.start()


def hostport(text):
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main():
    global _out, _max_value
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", type=hostport, required=True, help="host:port to accept clients on")
    ap.add_argument("--upstream", type=hostport, required=True, help="host:port of the real server")
    ap.add_argument("--log", help="file to append decoded messages to (default stderr)")
    ap.add_argument("--max-value", type=int, default=200, help="longest parameter/column value shown")
    args = ap.parse_args()
    _max_value = args.max_value
    if args.log:
        _out = open(args.log, "a", buffering=1)
    try:
        serve(args.listen, args.upstream)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
