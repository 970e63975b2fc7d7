"""The committed key vectors (``keys.json``): loading them, the Python value each one describes, and checking a
jitkey build against them. Used by tests/test_keys.py, by ``make_vectors.py`` and, without pytest or torch, by
``scripts/install_check.sh`` under every Python version it finds (``python tests/vectors/vectors.py``: the
vectors of torch types are skipped when torch is not installed).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

PATH = Path(__file__).parent / "keys.json"


def load() -> dict[str, Any]:
    return json.loads(PATH.read_text())  # type: ignore[no-any-return]


def value(s: dict[str, Any]) -> Any:
    """The Python value a vector's spec describes (``dtype``/``device``/``layout``/``memory_format`` specs import
    torch)."""
    t = s["t"]
    if t == "none":
        return None
    if t in ("bool", "str"):
        return s["v"]
    if t == "int":
        return int(s["v"])
    if t == "float":
        return struct.unpack("<d", struct.pack("<Q", int(s["bits"], 16)))[0]
    if t == "bytes":
        return bytes.fromhex(s["hex"])
    if t == "tuple":
        return tuple(value(x) for x in s["v"])
    if t == "dtype":
        import torch

        return getattr(torch, s["v"])
    if t == "device":
        import torch

        return torch.device(s["type"], s["index"]) if s["index"] is not None else torch.device(s["type"])
    if t in ("layout", "memory_format"):
        import torch

        v = getattr(torch, s["v"])
        assert type(v) is getattr(torch, t)
        return v
    if t == "object":
        module, qualname = s["module"], s["qualname"]
        inner = value(s["v"])
        cls = type(qualname.rpartition(".")[2], (), {"__jitkey__": lambda self: inner, "__module__": module})
        cls.__qualname__ = qualname
        return cls()
    raise ValueError(t)


def needs_torch(s: dict[str, Any]) -> bool:
    if s["t"] in ("dtype", "device", "layout", "memory_format"):
        return True
    if s["t"] == "tuple":
        return any(needs_torch(x) for x in s["v"])
    return s["t"] == "object" and needs_torch(s["v"])


def mismatches(jitkey: Any, vector: dict[str, Any]) -> list[str]:
    """What ``jitkey`` (the module) encodes or digests otherwise than ``vector`` says."""
    v = value(vector["value"])
    out = []
    if jitkey.encode(v).hex() != vector["encoding"]:
        out.append("encoding")
    if jitkey.digest(v).hex() != vector["digest"]:
        out.append("digest")
    if jitkey.digest_encoding(bytes.fromhex(vector["encoding"])).hex() != vector["digest"]:
        out.append("digest_encoding")
    return out


def main() -> int:
    import importlib.util
    import sys

    import jitkey

    doc = load()
    if doc["format_version"] != jitkey.FORMAT_VERSION or bytes.fromhex(doc["domain"]) != jitkey.DIGEST_DOMAIN:
        print("the vectors' format version or domain is not this build's", file=sys.stderr)
        return 1
    torch = importlib.util.find_spec("torch") is not None
    checked = skipped = 0
    bad = []
    for vec in doc["vectors"]:
        if needs_torch(vec["value"]) and not torch:
            skipped += 1
            continue
        checked += 1
        if mismatches(jitkey, vec):
            bad.append(json.dumps(vec["value"])[:80])
    print(f"key vectors: {checked} checked, {skipped} skipped (no torch), {len(bad)} differ")
    for b in bad:
        print("  differs:", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
