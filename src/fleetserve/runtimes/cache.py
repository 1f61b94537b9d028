"""The runtimes' cache directory and what its entries are keyed on. Its entries (ONNX
exports, OpenVINO conversions, mapped weights) are built once per host by
:func:`fleetserve.catalog.entries.build_entry`."""

from __future__ import annotations

from pathlib import Path

DEFAULT_CACHE = Path("~/.cache/fleetserve").expanduser()
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weights_fingerprint(path: Path) -> bytes:
    """The bytes of config.json, then each weight file's name, size and mtime: cheap to
    read (no large file is opened), and new weights in the same directory change it."""
    parts = [(path / "config.json").read_bytes()]
    for f in sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()):
        st = f.stat()
        parts.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return b"".join(parts)


__all__ = ["DEFAULT_CACHE", "WEIGHT_SUFFIXES", "weights_fingerprint"]
