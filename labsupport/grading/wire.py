"""How the judge and a worker talk: small JSON messages over two pipes, tensors through a sealed
shared-memory buffer the judge owns.

Nothing on this wire is pickled, imported or executed. A message is a 4-byte length and a JSON
object of at most :data:`MESSAGE_BYTES`; a reply that carries tensors lists each one's dtype,
shape and offset in the buffer, and the judge copies them out after checking that every one is a
plain dtype of the allowed kinds and lies inside the buffer. The buffer is a ``memfd`` the judge
creates, sizes and seals against shrinking and growing before the worker starts, so a worker can
write numbers into it but cannot make the judge's mapping fault.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import select
import struct
import time

import torch

MESSAGE_BYTES = 64 * 2**10
# The deepest nesting of arrays and objects a message may have (the protocol's own go 3 deep: a
# reply's list of tensor descriptions, each a dict with a shape list). Deeper is refused before
# json.loads sees it: a frame of 64 KiB of "[" raised RecursionError inside it (issue 60).
MAX_DEPTH = 32
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64, "uint8": torch.uint8, "int8": torch.int8, "int64": torch.int64, "int32": torch.int32,
          "bool": torch.bool}
ALIGN = 64  # each tensor starts on a cache line


class WireError(RuntimeError):
    """The other side broke the protocol (or went away): what it sent, and why it was refused."""


def buffer(nbytes: int) -> tuple[int, mmap.mmap]:
    """A new sealed shared buffer of ``nbytes`` (its fd, to pass to the worker, and the judge's map)."""
    fd = os.memfd_create("lab-wire", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, nbytes)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd, mmap.mmap(fd, nbytes)


def send(fd: int, message: dict) -> None:
    data = json.dumps(message).encode()
    if len(data) > MESSAGE_BYTES:
        raise WireError(f"a message of {len(data)} bytes (at most {MESSAGE_BYTES})")
    _write_all(fd, struct.pack(">I", len(data)) + data)


def receive(fd: int, timeout_s: float | None = None) -> dict:
    """The next message from ``fd``: a JSON object, or a WireError (too long, not JSON, closed, or
    not complete within ``timeout_s``)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    (size,) = struct.unpack(">I", _read_exactly(fd, 4, deadline))
    if size > MESSAGE_BYTES:
        raise WireError(f"a message of {size} bytes announced (at most {MESSAGE_BYTES})")
    data = _read_exactly(fd, size, deadline)
    depth = nesting(data)
    if depth > MAX_DEPTH:
        raise WireError(f"a message nested {depth} deep (at most {MAX_DEPTH})")
    try:
        message = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise WireError(f"a message that is not JSON: {type(err).__name__}: {str(err)[:100]}") from None
    if not isinstance(message, dict):
        raise WireError("a message that is not a JSON object")
    return message


def nesting(data: bytes) -> int:
    """How deep ``data``'s JSON arrays and objects nest at most (brackets inside strings not counted)."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:  # every reply the protocol sends: no scan
        return data.count(b"[") + data.count(b"{")
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # closing quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def put(view: memoryview, tensors: list[torch.Tensor]) -> list[dict]:
    """Copy ``tensors`` (on any device) into the shared buffer; their descriptions for a message."""
    out, offset = [], 0
    for t in tensors:
        t = t.detach()
        name = str(t.dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise WireError(f"a tensor of dtype {name} cannot be sent (only {', '.join(DTYPES)})")
        nbytes = t.numel() * t.element_size()
        if offset + nbytes > len(view):
            raise WireError(f"tensors of {offset + nbytes} bytes do not fit the {len(view)}-byte buffer")
        if nbytes:
            dest = torch.frombuffer(view, dtype=torch.uint8, count=nbytes, offset=offset)
            dest.view(t.dtype).view(t.shape).copy_(t)
        out.append({"dtype": name, "shape": list(t.shape), "offset": offset})
        offset += -(-nbytes // ALIGN) * ALIGN
    return out


def take(view: memoryview, described) -> list[torch.Tensor]:
    """The judge's own copies of the tensors ``described`` in a reply, each checked to be an allowed
    dtype with a plain shape that lies inside the buffer."""
    if not isinstance(described, list):
        raise WireError("tensors not described as a list")
    out = []
    for d in described:
        if not isinstance(d, dict) or d.get("dtype") not in DTYPES:
            raise WireError(f"a tensor described as {str(d)[:80]}: not one of the dtypes {list(DTYPES)}")
        shape, offset = d.get("shape"), d.get("offset")
        if (not isinstance(shape, list) or len(shape) > 8
                or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n for n in shape)
                or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0):
            raise WireError(f"a tensor with shape {str(shape)[:80]} at offset {str(offset)[:20]}")
        dtype = DTYPES[d["dtype"]]
        count = 1
        for n in shape:
            count *= n
        nbytes = count * dtype.itemsize
        if offset + nbytes > len(view):
            raise WireError(f"a tensor of {nbytes} bytes at offset {offset} lies outside the "
                            f"{len(view)}-byte buffer")
        flat = torch.frombuffer(view, dtype=torch.uint8, count=nbytes, offset=offset) if nbytes else \
            torch.empty(0, dtype=torch.uint8)
        out.append(flat.view(dtype).reshape(shape).clone())
    return out


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BrokenPipeError:
            raise WireError("the other side closed the channel") from None
        view = view[n:]


def _read_exactly(fd: int, size: int, deadline: float | None = None) -> bytes:
    chunks, left = [], size
    while left:
        if deadline is not None and not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise WireError("no answer in time")
        chunk = os.read(fd, left)
        if not chunk:
            raise WireError("the other side closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
