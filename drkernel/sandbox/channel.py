"""The wire between the judge and the subject (the process that runs the candidate), and between the judge and the
fork server.

Messages are length-prefixed JSON, never pickle: the judge decodes what an untrusted process sent, and nothing in a
message can run code there. Tensors travel as descriptions: on the CPU their bytes follow the header; on a GPU a
CUDA IPC handle to the sender's memory (no copy). The judge validates every description (dtype, shape, sizes)
before it maps anything, and maps the candidate's outputs read-only in spirit: it compares them, it never runs them.
"""

from __future__ import annotations

import base64
import json
import math
import os
import socket
from typing import Any, Callable

import torch

HEADER_BYTES = 8
MAX_HEADER = 64 << 20  # a JSON header larger than this is not a message of ours
MAX_DEPTH = 4  # nesting of lists and tuples in a value
DTYPES = {str(d): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.complex64, torch.complex128)}


class ChannelClosed(Exception):
    """The other side closed the connection or died."""


class BadMessage(Exception):
    """The other side sent something that is not a well-formed message."""


def _json_codec() -> tuple[Callable[[Any], str], Callable[[str], Any]]:
    """JSON through the interpreter's C accelerators, bound when this module loads: the subject's harness encodes
    its replies after candidate code has run, and a candidate that replaces `json.dumps`, `json.loads` or the
    encoder's module functions changes nothing here (the objects below are C types, and nothing leads to them)."""
    encode = json.encoder.c_make_encoder(  # type: ignore[attr-defined, misc]
        None, _not_json, json.encoder.c_encode_basestring_ascii, None, ":", ",", False, False, True)  # type: ignore
    scan = json.decoder.JSONDecoder().scan_once
    join = "".join

    def dumps(value: Any) -> str:
        return join(encode(value, 0))

    def loads(text: str) -> Any:
        try:
            value, end = scan(text, 0)
        except StopIteration as exc:
            raise ValueError(f"no JSON value at {exc.value}") from None
        if text[end:].strip():
            raise ValueError("extra data after the JSON value")
        return value

    return dumps, loads


def _not_json(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON")


_dumps, _loads = _json_codec()


class Channel:
    """One end of a stream socket over which (header, payloads) messages go."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._sendall, self._recv_into = sock.sendall, sock.recv_into  # bound now: later patching changes nothing

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, header: dict[str, Any], payloads: list[bytes] | None = None) -> None:
        payloads = payloads or []
        header = {**header, "_payloads": [len(p) for p in payloads]}
        data = _dumps(header).encode()
        try:
            self._sendall(len(data).to_bytes(HEADER_BYTES, "little") + data)
            for payload in payloads:
                self._sendall(payload)
        except OSError as exc:
            raise ChannelClosed(str(exc)) from exc

    def receive(self, max_payload: int | None = None) -> tuple[dict[str, Any], list[bytearray]]:
        size = int.from_bytes(self._exactly(HEADER_BYTES), "little")
        if size > MAX_HEADER:
            raise BadMessage(f"a message header of {size} bytes")
        try:
            header = _loads(self._exactly(size).decode())
        except ValueError as exc:
            raise BadMessage(f"not JSON: {exc}") from exc
        if not isinstance(header, dict):
            raise BadMessage("a message is not an object")
        lengths = header.pop("_payloads", [])
        if not (isinstance(lengths, list) and all(isinstance(n, int) and n >= 0 for n in lengths)):
            raise BadMessage("bad payload lengths")
        if max_payload is not None and sum(lengths) > max_payload:
            raise BadMessage(f"{sum(lengths)} payload bytes, more than the {max_payload} expected")
        return header, [self._exactly(n) for n in lengths]

    def _exactly(self, n: int) -> bytearray:
        buffer = bytearray(n)
        view, got = memoryview(buffer), 0
        while got < n:
            try:
                chunk = self._recv_into(view[got:], n - got)
            except OSError as exc:
                raise ChannelClosed(str(exc)) from exc
            if chunk == 0:
                raise ChannelClosed("the other side closed the connection")
            got += chunk
        return buffer


def pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


# -- values: tensors, numbers, strings, lists and tuples of them ------------------------------------------------


class Encoder:
    """Turns a value into a JSON-able description plus payloads. On CUDA, `keep` holds what was shared until the
    receiver has used it (the sender's memory must outlive the receiver's mapping). A CUDA IPC handle opens the
    whole allocation a tensor lies in, not the tensor: a sender with memory of its own to protect passes `copy`,
    which puts each tensor it shares where nothing else of the sender's lies (the judge's `SharedCopies`)."""

    def __init__(self, copy: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.payloads: list[bytes] = []
        self.keep: list[torch.Tensor] = []
        self.copy = copy

    def encode(self, value: Any, depth: int = 0) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, (list, tuple)) and depth < MAX_DEPTH:
            return {"seq": "list" if isinstance(value, list) else "tuple",
                    "items": [self.encode(v, depth + 1) for v in value]}
        if value is None or isinstance(value, (bool, int, str)):
            return {"value": value}
        if isinstance(value, float):
            return {"float": repr(value)}  # NaN and infinities survive JSON
        return {"object": type(value).__name__}

    def _tensor(self, tensor: torch.Tensor) -> dict[str, Any]:
        plain = torch.Tensor._make_subclass(torch.Tensor, tensor.detach()) if type(tensor) is not torch.Tensor \
            else tensor.detach()
        if plain.is_cuda:
            plain = self.copy(plain) if self.copy is not None else plain.contiguous()
            self.keep.append(plain)
            storage = plain.untyped_storage()
            device, handle, size, offset, rc_handle, rc_offset, event, event_sync = storage._share_cuda_()
            return {"tensor": str(plain.dtype), "shape": list(plain.shape), "device": "cuda",
                    "ipc": [device, _b64(handle), size, offset, _b64(rc_handle), rc_offset, _b64(event), event_sync],
                    "offset": plain.storage_offset()}
        data = plain.contiguous().cpu()
        self.payloads.append(data.view(torch.uint8).reshape(-1).numpy().tobytes() if data.numel() else b"")
        return {"tensor": str(plain.dtype), "shape": list(plain.shape), "device": "cpu",
                "payload": len(self.payloads) - 1}


def decode(description: Any, payloads: list[bytearray], device: torch.device, depth: int = 0) -> Any:
    """The value a description stands for. Tensors come back plain and contiguous, on `device`: CPU ones own their
    bytes, CUDA ones map the sender's memory (clone them to keep them past the sender's next message)."""
    if not isinstance(description, dict):
        raise BadMessage("a value description is not an object")
    if "tensor" in description:
        return _decode_tensor(description, payloads, device)
    if "seq" in description:
        items = description.get("items")
        if depth >= MAX_DEPTH or not isinstance(items, list):
            raise BadMessage("bad sequence")
        values = [decode(item, payloads, device, depth + 1) for item in items]
        return tuple(values) if description["seq"] == "tuple" else values
    if "value" in description:
        value = description["value"]
        if value is not None and not isinstance(value, (bool, int, str)):
            raise BadMessage("bad scalar")
        return value
    if "float" in description:
        try:
            return float(description["float"])
        except (TypeError, ValueError) as exc:
            raise BadMessage("bad float") from exc
    if "object" in description:
        return Opaque(str(description["object"])[:100])
    raise BadMessage("unknown value kind")


class Opaque:
    """Stands for an object that is not a tensor, number or string (it cannot cross; its type name can)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


def _decode_tensor(d: dict[str, Any], payloads: list[bytearray], device: torch.device) -> torch.Tensor:
    dtype = DTYPES.get(d.get("tensor"))  # type: ignore[arg-type]
    shape = d.get("shape")
    if dtype is None or not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise BadMessage("bad tensor description")
    numel = math.prod(shape)
    nbytes = numel * _itemsize(dtype)
    if d.get("device") == "cpu":
        index = d.get("payload")
        if not isinstance(index, int) or not 0 <= index < len(payloads) or len(payloads[index]) != nbytes:
            raise BadMessage("tensor bytes do not match its shape")
        flat = torch.frombuffer(payloads[index], dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8)
        return flat.view(dtype).reshape(shape).to(device)
    ipc, offset = d.get("ipc"), d.get("offset")
    if device.type != "cuda" or not isinstance(ipc, list) or len(ipc) != 8 or not isinstance(offset, int):
        raise BadMessage("bad CUDA tensor description")
    dev, handle, size, storage_offset, rc_handle, rc_offset, event, event_sync = ipc
    if not all(isinstance(v, int) for v in (dev, size, storage_offset, rc_offset)) or offset < 0 \
            or (offset + numel) * _itemsize(dtype) > size:
        raise BadMessage("a CUDA tensor larger than its storage")
    try:
        storage = torch.UntypedStorage._new_shared_cuda(
            dev, _unb64(handle), size, storage_offset, _unb64(rc_handle), rc_offset, _unb64(event), bool(event_sync))
    except (RuntimeError, TypeError, ValueError) as exc:
        raise BadMessage(f"cannot map the CUDA memory: {exc}") from exc
    tensor = torch.empty(0, dtype=dtype, device=device)
    return tensor.set_(storage, offset, shape, _contiguous_strides(shape))


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return list(reversed(strides))


def _b64(value: Any) -> Any:
    return {"b64": base64.b64encode(value).decode()} if isinstance(value, bytes) else value


def _unb64(value: Any) -> Any:
    if isinstance(value, dict) and isinstance(value.get("b64"), str):
        return base64.b64decode(value["b64"])
    if value is None or isinstance(value, (int, str)):
        return value
    raise BadMessage("bad IPC field")


# -- the judge's reports to the fork server -------------------------------------------------------------------


def report(fd: int, event: dict[str, Any]) -> None:
    """One line to the fork server on the judge's own pipe (start, GPU waits, the result)."""
    data = (json.dumps(event) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
