"""A user's toy write-ahead log, for the crash lab's tests.

    toy_wal.py write URL correct|buggy N   append N records through NBD (python3-libnbd)
    toy_wal.py check IMAGE                 exit 0 if every committed record is whole

Layout: sector 0 holds the header (magic WALH, the number of committed records, CRC32);
record i (from 1) fills the 4 KiB block i (magic WALR, its number, its payload, CRC32).
The correct protocol writes record i, flushes, then writes the header that commits it and
flushes again. The buggy one writes the header first, then the record, then flushes once:
a power cut can leave a header that commits a record that is not there.
"""

import struct
import sys
import zlib

BLOCK = 4096


def header(n):
    body = struct.pack("<4sI", b"WALH", n)
    return (body + struct.pack("<I", zlib.crc32(body))).ljust(512, b"\0")


def record(i):
    payload = bytes((i * 7 + k) % 251 for k in range(BLOCK - 12))
    body = struct.pack("<4sI", b"WALR", i) + payload
    return body + struct.pack("<I", zlib.crc32(body))


def write(url, mode, n):
    import nbd

    h = nbd.NBD()
    h.connect_uri(url)
    for i in range(1, n + 1):
        if mode == "correct":
            h.pwrite(record(i), i * BLOCK)
            h.flush()
            h.pwrite(header(i), 0)
            h.flush()
        else:
            h.pwrite(header(i), 0)
            h.pwrite(record(i), i * BLOCK)
            h.flush()
    h.shutdown()
    print("ok")


def check(path):
    with open(path, "rb") as f:
        head = f.read(512)
        if head.strip(b"\0") == b"":
            print("empty log")
            return 0
        magic, n = struct.unpack("<4sI", head[:8])
        (crc,) = struct.unpack("<I", head[8:12])
        if magic != b"WALH" or zlib.crc32(head[:8]) != crc:
            print("the header is damaged")
            return 1
        for i in range(1, n + 1):
            f.seek(i * BLOCK)
            if f.read(BLOCK) != record(i):
                print(f"record {i} is committed by the header (n={n}) but not whole")
                return 1
    print(f"{n} records committed, all whole")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(check(sys.argv[2]))
