"""Every NBD command and flag against `tagstripe serve`, checked against a byte model.

Run by cli/tests/nbd_protocol.rs with /usr/bin/python3 and libnbd's bindings:
    nbd_model.py URI SIZE INTERLEAVE_SECTORS COMPONENTS SEED

The export is a volume striped over COMPONENTS equal files with no reserved area, so the
component holding byte b is (b // 512 // INTERLEAVE) % COMPONENTS.  The client asks for no
block sizes and turns libnbd's strict checks off, so unaligned and huge requests reach the
server (which then must serve any alignment, and requests over its 32 MiB maximum).
"""
import random
import sys

import nbd

uri, size, interleave, ncomp, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)
model = bytearray(size)
counts = {}


def count(what):
    counts[what] = counts.get(what, 0) + 1


def connect():
    h = nbd.NBD()
    h.add_meta_context("base:allocation")
    h.add_meta_context("tagstripe:component")
    h.set_request_block_size(False)
    h.set_strict_mode(0)
    h.connect_uri(uri)
    return h


h = connect()
assert h.get_size() == size, (h.get_size(), size)
assert h.get_structured_replies_negotiated()
for ctx in ("base:allocation", "tagstripe:component"):
    assert h.can_meta_context(ctx), ctx
for can in ("can_cache", "can_df", "can_fast_zero", "can_flush", "can_fua", "can_trim", "can_zero", "can_multi_conn"):
    assert getattr(h, can)(), can


def span(max_len, aligned):
    n = rng.choice([1, 7, 511, 512, 4096, 65536, 1 << 20, rng.randrange(1, max_len)])
    n = min(n, max_len)
    if aligned:
        n = max(512, n // 512 * 512)
    off = rng.randrange(0, size - n + 1)
    if aligned:
        off = off // 512 * 512
    return off, n


def check_read(off, n, flags=0):
    got = h.pread(n, off, flags)
    assert got == model[off:off + n], f"read {off}+{n} differs"


def structured_read(off, n, flags):
    chunks = []
    buf = bytearray(n)

    def cb(sub, boff, status, err):
        chunks.append((boff, len(sub), status))
        return 0
    data = h.pread_structured(n, off, cb, flags)
    assert data == model[off:off + n], f"structured read {off}+{n} differs"
    covered = sorted((b, b + l) for b, l, _ in chunks)
    assert covered[0][0] == off and covered[-1][1] == off + n, covered
    for (a0, a1), (b0, b1) in zip(covered, covered[1:]):
        assert a1 == b0, covered
    for b, l, st in chunks:
        if st == nbd.READ_HOLE:
            assert model[b:b + l] == bytes(l), "a hole chunk over data"
    if flags & nbd.CMD_FLAG_DF:
        assert len(chunks) == 1, f"DF read in {len(chunks)} chunks"
    return chunks


def block_status(off, n, flags=0):
    seen = {}

    def cb(ctx, boff, entries, err):
        seen[ctx] = (boff, list(entries))
        return 0
    h.block_status(n, off, cb, flags)
    assert set(seen) == {"base:allocation", "tagstripe:component"}, seen.keys()
    for ctx, (boff, entries) in seen.items():
        assert boff == off, (ctx, boff, off)
        pairs = list(zip(entries[0::2], entries[1::2]))
        assert pairs and all(l > 0 for l, _ in pairs), (ctx, pairs)
        if flags & nbd.CMD_FLAG_REQ_ONE:
            assert len(pairs) == 1 and pairs[0][0] <= n, (ctx, pairs)
        pos = off
        for l, st in pairs:
            end = min(pos + l, size)
            if ctx == "base:allocation" and st & nbd.STATE_ZERO:
                assert model[pos:end] == bytes(end - pos), f"zero extent {pos}+{l} holds data"
            if ctx == "tagstripe:component":
                comp = st & 0xffff
                assert st >> 16 == 0, "no mirror here"
                for probe in {pos, end - 1}:
                    want = (probe // 512 // interleave) % ncomp
                    assert comp == want, f"byte {probe}: component {comp}, the map says {want}"
            pos += l
        assert pos >= min(off + n, size) or flags & nbd.CMD_FLAG_REQ_ONE, (ctx, pos, off, n)


for step in range(400):
    op = rng.choice(["write", "write", "read", "sread", "df", "zero", "trim", "cache", "flush", "status", "status1"])
    aligned = rng.random() < 0.5
    if op == "write":
        off, n = span(2 << 20, aligned)
        data = bytes([rng.randrange(1, 256)]) * n if rng.random() < 0.5 else rng.randbytes(n)
        h.pwrite(data, off, nbd.CMD_FLAG_FUA if rng.random() < 0.3 else 0)
        model[off:off + n] = data
    elif op == "read":
        off, n = span(2 << 20, aligned)
        check_read(off, n)
    elif op == "sread":
        off, n = span(4 << 20, aligned)
        structured_read(off, n, 0)
    elif op == "df":
        off, n = span(1 << 20, aligned)
        structured_read(off, n, nbd.CMD_FLAG_DF)
    elif op == "zero":
        off, n = span(4 << 20, aligned)
        flags = rng.choice([0, nbd.CMD_FLAG_NO_HOLE, nbd.CMD_FLAG_FAST_ZERO, nbd.CMD_FLAG_FUA])
        try:
            h.zero(n, off, flags)
            model[off:off + n] = bytes(n)
        except nbd.Error as e:
            # Only fast zeroing may be refused (a partial block needs read-modify-write).
            assert flags == nbd.CMD_FLAG_FAST_ZERO and e.errnum == 95, (e, flags)
            assert off % 512 or n % 512, "an aligned fast zero was refused"
            count("fast zero refused")
    elif op == "trim":
        off, n = span(4 << 20, aligned)
        h.trim(n, off, 0)
        t0, t1 = -(-off // 512) * 512, (off + n) // 512 * 512
        if t1 > t0:
            model[t0:t1] = bytes(t1 - t0)
    elif op == "cache":
        off, n = span(4 << 20, aligned)
        h.cache(n, off, 0)
    elif op == "flush":
        h.flush()
    elif op == "status":
        off, n = span(size, rng.random() < 0.7)
        block_status(off, n)
    elif op == "status1":
        off, n = span(size, rng.random() < 0.7)
        block_status(off, n, nbd.CMD_FLAG_REQ_ONE)
    count(op)

# Requests over the 32 MiB maximum payload, unaligned: streamed through the server.
big = 40 << 20
data = rng.randbytes(big)
off = 12345
h.pwrite(data, off)
model[off:off + big] = data
assert h.pread(big, off + 1) == model[off + 1:off + 1 + big]
structured_read(off, big, 0)
count("huge")

# Out of range and bad flags: errors, and the connection stays usable.
for bad in (lambda: h.pread(512, size), lambda: h.pwrite(b"x" * 512, size - 256)):
    try:
        bad()
        raise AssertionError("an out-of-range request succeeded")
    except nbd.Error as e:
        assert e.errnum in (22, 28), e
h.shutdown()

# A second connection sees everything: the whole export against the model.
h = connect()
step = 8 << 20
for off in range(0, size, step):
    n = min(step, size - off)
    assert h.pread(n, off) == model[off:off + n], f"final read at {off} differs"
h.shutdown()
print("model ok", sorted(counts.items()))
