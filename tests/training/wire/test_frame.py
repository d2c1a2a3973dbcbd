"""Frames: what goes in comes out, a frame survives being waited for in slices, and anything that
is not a frame of ours is refused before anything is allocated for it."""

from __future__ import annotations

import os
import socket
import struct
import threading

import numpy as np
import pytest

from transient_nb.training.wire.frame import (
    ENTRY,
    IN_REGION,
    MAGIC,
    MAX_META,
    PREFIX,
    PULL,
    PUSH_PULL,
    REPLY,
    SETUP,
    Buffers,
    Channel,
    FrameError,
    decode_prefix,
    drive,
    encode_head,
)
from transient_nb.training.wire.region import Region


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield Channel(a), Channel(b)
    a.close()
    b.close()


def test_arrays_of_every_wire_dtype_and_missing_ones_come_back_as_sent(pair):
    left, right = pair
    arrays = [
        np.arange(5, dtype=np.float32),
        None,
        np.arange(3, dtype=np.float16),
        np.array([16256, -16512], np.int16),  # bfloat16 bits
        np.zeros(0, np.float32),
    ]
    drive(left, left.send_frame(PUSH_PULL, {"trainer": "w-1", "n": 3}, arrays), 5)
    kind, meta, got = drive(right, right.recv_frame(Buffers()), 5)
    assert kind == PUSH_PULL and meta == {"trainer": "w-1", "n": 3}
    assert got[1] is None
    sent_arrays = [a for a in arrays if a is not None]
    for sent, back in zip(sent_arrays, [g for g in got if g is not None], strict=True):
        assert back.dtype == sent.dtype and back.tolist() == sent.tolist()


def test_buffers_are_kept_between_frames_and_grow_when_needed(pair):
    left, right = pair
    buffers = Buffers()
    drive(left, left.send_frame(REPLY, {}, [np.ones(4, np.float32)]), 5)
    first = drive(right, right.recv_frame(buffers), 5)[2][0]
    drive(left, left.send_frame(REPLY, {}, [np.full(4, 2, np.float32)]), 5)
    second = drive(right, right.recv_frame(buffers), 5)[2][0]
    assert np.shares_memory(first, second) and second.tolist() == [2.0] * 4
    drive(left, left.send_frame(REPLY, {}, [np.full(40, 3, np.float32)]), 5)
    assert drive(right, right.recv_frame(buffers), 5)[2][0].tolist() == [3.0] * 40


def test_a_frame_waited_for_in_slices_goes_on_where_it_stopped(pair):
    left, right = pair
    big = np.arange(2_000_000, dtype=np.float32)  # 8 MB: more than the socket buffers hold
    head = encode_head(REPLY, {"v": 1}, [big])
    step = right.recv_frame(Buffers())
    # Nothing sent yet: a slice of 50 ms runs out.
    with pytest.raises(TimeoutError):
        drive(right, step, 0.05)
    left.sock.sendall(head[:7])  # a part of the prefix
    with pytest.raises(TimeoutError):
        drive(right, step, 0.05)
    sender = threading.Thread(target=lambda: left.sock.sendall(head[7:] + big.tobytes()))
    sender.start()
    kind, meta, arrays = drive(right, step, 30)
    sender.join(30)
    assert (kind, meta) == (REPLY, {"v": 1}) and np.array_equal(arrays[0], big)


def test_a_send_waited_for_in_slices_loses_no_byte(pair):
    left, right = pair
    big = np.arange(3_000_000, dtype=np.float32)
    step = left.send_frame(REPLY, {}, [big])
    with pytest.raises(TimeoutError):  # the peer reads nothing: the buffers fill up
        drive(left, step, 0.05)
    got = []
    reader = threading.Thread(
        target=lambda: got.append(drive(right, right.recv_frame(Buffers()), 30))
    )
    reader.start()
    drive(left, step, 30)
    reader.join(30)
    assert np.array_equal(got[0][2][0], big)


def test_bytes_that_are_not_a_frame_are_refused(pair):
    left, right = pair
    left.sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(FrameError):
        drive(right, right.recv_frame(Buffers()), 5)


@pytest.mark.parametrize(
    "prefix, table",
    [
        (PREFIX.pack(MAGIC, 99, 0, 0, 0), b""),  # unknown kind
        (PREFIX.pack(MAGIC, PULL, 200, 0, 0), b""),  # too many arrays
        (PREFIX.pack(MAGIC, PULL, 0, 0, MAX_META + 1), b""),  # too much metadata
        (PREFIX.pack(MAGIC, PULL, 1, 0, 0), ENTRY.pack(9, 4, 0)),  # unknown dtype
        (PREFIX.pack(MAGIC, PULL, 1, 0, 0), ENTRY.pack(1, 1 << 40, 0)),  # a terabyte
        (PREFIX.pack(MAGIC, PULL, 1, 0, 0), ENTRY.pack(1, 6, 0)),  # 1.5 float32
        (PREFIX.pack(MAGIC, PULL, 1, 0, 0), ENTRY.pack(1 | IN_REGION, 4, 0)),  # no region
    ],
    ids=["kind", "arrays", "meta", "dtype", "huge", "ragged", "no-region"],
)
def test_bad_prefixes_and_entries_are_refused(pair, prefix, table):
    left, right = pair
    left.sock.sendall(prefix + table)
    with pytest.raises(FrameError):
        drive(right, right.recv_frame(Buffers()), 5)


def test_metadata_must_be_a_json_object(pair):
    left, right = pair
    left.sock.sendall(PREFIX.pack(MAGIC, PULL, 0, 0, 4) + b"[1]\n")
    with pytest.raises(FrameError):
        drive(right, right.recv_frame(Buffers()), 5)


def test_a_closed_peer_is_a_connection_error(pair):
    left, right = pair
    left.close()
    with pytest.raises(ConnectionError):
        drive(right, right.recv_frame(Buffers()), 5)


def test_only_frames_of_our_arrays_are_encoded():
    with pytest.raises(ValueError, match="No wire code"):
        encode_head(PULL, {}, [np.zeros(2, np.float64)])
    with pytest.raises(ValueError, match="C-contiguous"):
        encode_head(PULL, {}, [np.zeros((4, 4), np.float32)[:, 0]])
    with pytest.raises(ValueError, match="Unknown frame kind"):
        encode_head(7, {}, [])
    assert decode_prefix(encode_head(PULL, {"a": 1}, [])[: PREFIX.size]) == (PULL, 0, 7)
    with pytest.raises(FrameError):
        decode_prefix(struct.pack("<4sBBHI", b"HTTP", PULL, 0, 0, 0))


def test_arrays_in_the_shared_region_are_read_in_place_and_its_descriptor_travels(pair):
    left, right = pair
    region = Region.create(4096)
    drive(left, left.send_frame(SETUP, {}, [], fd=region.fd), 5)
    kind, _, _ = drive(right, right.recv_frame(Buffers()), 5)
    fds = right.take_fds()
    assert kind == SETUP and len(fds) == 1 and right.take_fds() == []
    theirs = Region.adopt(fds[0])
    grad = region.view(128, np.dtype(np.float32), 16)
    grad[:] = 7.0
    drive(left, left.send_frame(PUSH_PULL, {}, [grad, np.ones(2, np.float32)], [128, None]), 5)
    _, _, arrays = drive(right, right.recv_frame(Buffers(), region=theirs), 5)
    assert arrays[0].tolist() == [7.0] * 4 and arrays[1].tolist() == [1.0, 1.0]
    grad[:] = 8.0  # the same memory: no copy was made
    assert arrays[0].tolist() == [8.0] * 4
    # An entry that points outside the region is refused.
    drive(left, left.send_frame(PUSH_PULL, {}, [grad], [4096]), 5)
    with pytest.raises(FrameError):
        drive(right, right.recv_frame(Buffers(), region=theirs), 5)
    region.close()
    theirs.close()


def test_descriptors_left_with_a_closed_channel_are_closed(pair):
    left, right = pair
    region = Region.create(64)
    drive(left, left.send_frame(SETUP, {}, [], fd=region.fd), 5)
    drive(right, right.recv_frame(Buffers()), 5)
    fd = right.fds[0]
    right.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    region.close()
