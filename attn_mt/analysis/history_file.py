"""A run's attention history file, RUN/attention_history.npz (history.py writes it): its layout,
and reading it back with every declared size, count and value checked before anything is allocated.

The file: np.savez (uncompressed), rewritten whole at each record through RunDir.write_history
(atomic). E records (step 0's, then one per evaluation), A attention modules, H heads, P probes,
R = len(ROLES):
    meta         (1,) str    JSON: format, model_kind, modules (A names), n_heads, roles (the R
                             names), probes (P objects: kind, source, target, src_tokens,
                             tgt_tokens), items (the contrastive probes' records,
                             decoding/contrastive.py's format, in probe order)
    steps        (E,) int64  the step of each record, ascending (0 first where the run started anew)
    bleu         (E,) float64        validation BLEU at that step (NaN: unknown, as at step 0)
    contrastive  (E,) float64        contrastive accuracy on the probe items (NaN: no items)
    entropy      (E, A, H) float32   mean attention entropy / log(#keys) over the probes' queries
    roles        (R, E, A, H) float32  each role's share (roles.py; NaN: the role does not apply)
    coref        (E, A, H) float32   share of the contrastive probes a head resolves (with items)
    map_{p}_{a}  (E, H, Q, K) float16  probe p's weights in module a: encoder self S x S, decoder
                             self T x T, cross T x S (S = len(src_tokens), T = len(tgt_tokens))

Its size for configs/multi30k.yaml (the hour config; a German source: 4 validation probes, no items,
no classic): A = 9 modules (3 encoder self, 3 decoder self, 3 cross), H = 4, S, T <= MAX_LEN = 12,
and step 0 and one evaluation per epoch, at most 1 + max_epochs = 101 records (the hour on 2 CPU
cores made 29-31 evaluations): maps at most 101 x 4 probes x 3 layers x 4 heads x (12*12 + 12*12 +
12*12) x 2 bytes = 4,188,672 bytes, roles 8 x 101 x 9 x 4 x 4 = 116,352, entropy 14,544, the rest
(steps, BLEU, the meta's JSON as UTF-32, 42 arrays' npy and zip headers) under 40,000: at most
4,359,568 bytes (about 4.3 MB with Multi30k-length sentences; about 1.3 MB at 32 records). Past
MAX_RECORDS records a run records no more.

Reading (`read`) trusts nothing in the file. It must be a zip of stored .npy members (never
compressed: no member holds more bytes than the file, and the members read hold at most the file's
length together); meta's JSON is at most MAX_META characters, its counts within the bounds below (a
drawing's work grows with the heads, modules, probes and pieces); each member used is checked
against the shape that meta and steps declare, from its .npy header, before its bytes are read, and
only the members used are read; no number may be infinite (NaN: unknown, or does not apply), BLEU
lies in [0, 100], accuracy in [0, 1], steps ascend. Any failure is one InputError line naming the
file.

One job: the history's file layout and its checked reading. Tested in
tests/analysis/test_history_file.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.lib.format as npy

from attn_mt.data.lines import DataError
from attn_mt.decoding.contrastive import items_from_records
from attn_mt.errors import InputError

from .probes import N_ITEMS, N_VALID, PROBE_KINDS, Probe, module_shape
from .roles import ROLES

FORMAT = 1
MAX_RECORDS = 200  # records at most (step 0's included): the recorder writes no more
MAX_MODULES = 96  # attention modules (three a layer: 32 layers)
MAX_HEADS = 64  # heads a module
MAX_HEADS_IN_ALL = 512  # modules x heads: the rows of a drawing
MAX_PROBES = N_VALID + N_ITEMS + 2  # the classic sentence's two forms
MAX_PIECES = 1024  # pieces a side of a probe
MAX_META = 1 << 22  # characters of meta's JSON
MODULE = re.compile(r"encoder [1-9]\d{0,2} self|decoder [1-9]\d{0,2} (self|cross)|decoder cross")
HEADERS = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}
BROKEN = (ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, struct.error,
          NotImplementedError, RecursionError, OverflowError)  # what a crafted file raises, checked


@dataclass(frozen=True)
class Meta:
    """The meta member, checked."""

    model_kind: str
    modules: list[str]  # A
    n_heads: int  # H
    roles: list[str]  # R
    probes: list[Probe]  # P
    items: list[dict]  # the contrastive probes' records


class Members(Protocol):
    def header(self, name: str) -> tuple[tuple[int, ...], np.dtype] | None:
        """(shape, dtype) a member declares; None where there is none."""
        ...

    def array(self, name: str) -> np.ndarray: ...


class Loaded:
    """Arrays in memory (history.from_arrays)."""

    def __init__(self, arrays: dict) -> None:
        self.arrays = arrays

    def header(self, name: str) -> tuple[tuple[int, ...], np.dtype] | None:
        a = self.arrays.get(name)
        return None if a is None else (np.shape(a), np.asarray(a).dtype)

    def array(self, name: str) -> np.ndarray:
        return np.asarray(self.arrays[name])


class Archive:
    """The stored .npy members of an open zip of `length` bytes, each header read before its bytes,
    the bytes read counted against the file's length (members may not overlap)."""

    def __init__(self, z: zipfile.ZipFile, length: int) -> None:
        self.z, self.left, self.infos = z, length, {}
        for info in z.infolist():
            if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
                raise ValueError(f"member {info.filename[:40]!r} is compressed")
            if info.file_size > length:
                raise ValueError(f"member {info.filename[:40]!r} declares more than the file holds")
            self.infos[info.filename.removesuffix(".npy")] = info

    def _open(self, name: str):
        f = self.z.open(self.infos[name])
        version = npy.read_magic(f)
        if version not in HEADERS:
            raise ValueError(f"{name} is .npy version {version}")
        shape, fortran, dtype = HEADERS[version](f)
        return f, shape, fortran, dtype

    def header(self, name: str) -> tuple[tuple[int, ...], np.dtype] | None:
        if name not in self.infos:
            return None
        f, shape, _, dtype = self._open(name)
        f.close()
        return shape, dtype

    def array(self, name: str) -> np.ndarray:
        f, shape, fortran, dtype = self._open(name)
        with f:
            size, held = math.prod(shape) * dtype.itemsize, self.infos[name].file_size - f.tell()
            if dtype.hasobject or size != held:
                raise ValueError(f"{name} declares {shape} {dtype}, holds {held} bytes")
            self.left -= size
            if self.left < 0:
                raise ValueError("its members hold more bytes than the file")
            data = bytearray(size)
            if f.readinto(data) != size:
                raise EOFError(name)
        a = np.frombuffer(data, dtype)
        return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)


def read(path: Path) -> tuple[Meta, dict[str, np.ndarray]]:
    """The checked meta and arrays of the history file at `path` (the members used only); InputError
    naming it (field run_dir) when it cannot be read or is not a history within the bounds."""
    try:
        with open(path, "rb") as f:
            length = os.fstat(f.fileno()).st_size
            with zipfile.ZipFile(f) as z:
                return checked(Archive(z, length))
    except OSError as e:
        why = f"cannot be read ({e.strerror or e})"
    except zipfile.BadZipFile:
        why = "not an attention history (cut short, or not an .npz archive of arrays)"
    except BROKEN as e:
        text = f"no {e}" if isinstance(e, KeyError) else (str(e).splitlines() or [""])[0][:200]
        why = f"not an attention history ({text or type(e).__name__})"
    raise InputError(f"{path}: {why}", "run_dir", named=True)


def take(members: Members, name: str, shape: tuple[int, ...], kinds: str) -> np.ndarray:
    """Member `name`, read only once its header declares `shape` and a dtype of one of `kinds`."""
    got = members.header(name)
    if got is None:
        raise KeyError(name)
    if tuple(got[0]) != shape or got[1].kind not in kinds or got[1].hasobject:
        raise ValueError(f"{name} has shape {tuple(got[0])} ({got[1]}), expected {shape}")
    return members.array(name)


def checked(members: Members) -> tuple[Meta, dict[str, np.ndarray]]:
    """Meta and the arrays it declares, each shape checked before it is read, then their values."""
    head = members.header("meta")
    if head is None or head[1].kind != "U" or head[1].itemsize > 4 * MAX_META:
        raise ValueError(f"meta is not one string of at most {MAX_META} characters")
    meta = parse_meta(str(take(members, "meta", (1,), "U")[0]))
    steps_head = members.header("steps")
    e = steps_head[0][0] if steps_head is not None and len(steps_head[0]) == 1 else -1
    if not 0 <= e <= MAX_RECORDS:
        raise ValueError(f"steps is not a list of at most {MAX_RECORDS} records")
    shape = (e, len(meta.modules), meta.n_heads)
    arrays = {"steps": take(members, "steps", (e,), "iu"), "bleu": take(members, "bleu", (e,), "f"),
              "contrastive": take(members, "contrastive", (e,), "f"),
              "entropy": take(members, "entropy", shape, "f"),
              "roles": take(members, "roles", (len(meta.roles), *shape), "f")}
    if members.header("coref") is not None:
        arrays["coref"] = take(members, "coref", shape, "f")
    for p, probe in enumerate(meta.probes):
        for a, module in enumerate(meta.modules):
            name = f"map_{p}_{a}"
            arrays[name] = take(members, name, (e, meta.n_heads, *module_shape(module, probe)), "f")
    check_values(arrays)
    return meta, arrays


def check_values(arrays: dict[str, np.ndarray]) -> None:
    """No infinite number; steps >= 0, ascending; BLEU in [0, 100], accuracy in [0, 1] (or NaN)."""
    for name, a in arrays.items():
        if a.dtype.kind == "f" and np.isinf(a).any():
            raise ValueError(f"{name} holds an infinite value")
    steps = arrays["steps"]
    if np.any(steps < 0) or np.any(np.diff(steps.astype(np.float64)) <= 0):
        raise ValueError("steps are not ascending from 0 or more")
    for name, most in (("bleu", 100.0), ("contrastive", 1.0)):
        if np.any((arrays[name] < 0) | (arrays[name] > most)):
            raise ValueError(f"{name} is outside [0, {most:g}]")


def parse_meta(text: str) -> Meta:
    """Meta's JSON, every field checked against the bounds (ValueError naming the first wrong)."""
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("meta is not JSON (or nested too deep)") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"format {meta.get('format') if isinstance(meta, dict) else None!r:.40}, "
                         f"expected {FORMAT}")
    kind, n_heads = meta.get("model_kind"), meta.get("n_heads")
    if kind not in ("transformer", "rnn"):
        raise ValueError("model_kind is not transformer or rnn")
    modules = strings(meta.get("modules"), "modules", MAX_MODULES)
    if not modules or not all(MODULE.fullmatch(m) for m in modules):
        raise ValueError("modules are not the names of attention modules")
    if type(n_heads) is not int or not 1 <= n_heads <= MAX_HEADS \
            or len(modules) * n_heads > MAX_HEADS_IN_ALL:
        raise ValueError(f"n_heads is not 1 to {MAX_HEADS}, {MAX_HEADS_IN_ALL} with all modules")
    roles = strings(meta.get("roles"), "roles", 4 * len(ROLES))
    if not set(ROLES) <= set(roles) or len(set(roles)) != len(roles):
        raise ValueError("roles lack one or repeat one")
    probes = [probe(p) for p in bounded(meta.get("probes"), "probes", MAX_PROBES)]
    items = bounded(meta.get("items", []), "items", N_ITEMS)
    try:
        items_from_records(items)
    except DataError as e:
        raise ValueError(f"items: {e}") from None
    if len(items) != sum(p.kind == "contrastive" for p in probes):
        raise ValueError("items do not match the contrastive probes")
    return Meta(kind, modules, n_heads, roles, probes, [dict(i) for i in items])


def bounded(value: object, name: str, most: int) -> list:
    if not isinstance(value, list) or len(value) > most:
        raise ValueError(f"{name} is not a list of at most {most}")
    return value


def strings(value: object, name: str, most: int) -> list[str]:
    if not all(isinstance(s, str) for s in bounded(value, name, most)):
        raise ValueError(f"{name} are not all strings")
    return list(value)


def probe(p: object) -> Probe:
    """A probe of meta, checked."""
    if not isinstance(p, dict) or p.get("kind") not in PROBE_KINDS:
        raise ValueError("a probe is not an object of a known kind")
    texts = [p.get("source"), p.get("target")]
    src, tgt = (strings(p.get(k), "its pieces", MAX_PIECES) for k in ("src_tokens", "tgt_tokens"))
    if not all(isinstance(t, str) for t in texts) or not src or not tgt:
        raise ValueError("a probe lacks its texts or pieces")
    return Probe(p["kind"], *texts, src, tgt)
