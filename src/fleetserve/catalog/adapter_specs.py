"""Adapters a model spec declares: ``adapters: [{name, source, pinned}]``.

``name`` is the adapter's id, ``tenant/name`` (``public/legal-v1`` for everyone);
``source`` is where its directory is, in the forms model sources take (a local path
or ``file://``, ``hf:<org>/<name>`` in the Hugging Face cache layout, ``package:``,
``s3://bucket/prefix``);
``pinned`` keeps it loaded. The server registers them at start
(:func:`fleetserve.lora.declared.register_declared`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..wire import InvalidInput, parse_adapter_id

ADAPTER_FIELDS = ("name", "source", "pinned")
ADAPTER_SOURCES = "a local path, file://, hf:<org>/<name>, package:<module>/<dir> or s3://"


@dataclass(frozen=True)
class AdapterDecl:
    name: str  # tenant/name
    source: str
    pinned: bool = False


def parse_adapters(value: object) -> tuple[AdapterDecl, ...]:
    """The ``adapters`` key, strictly: a ``ValueError`` naming what is wrong."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(
            f"key 'adapters' must be a list of {{{', '.join(ADAPTER_FIELDS)}}}, "
            f"not {type(value).__name__}"
        )
    out: list[AdapterDecl] = []
    for i, item in enumerate(value):
        where = f"adapters[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where} must be a mapping of {', '.join(ADAPTER_FIELDS)}")
        unknown = sorted(str(k) for k in item if k not in ADAPTER_FIELDS)
        if unknown:
            raise ValueError(
                f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(ADAPTER_FIELDS)}"
            )
        name = item.get("name")
        if not isinstance(name, str):
            raise ValueError(f"{where}: key 'name' (the adapter id, tenant/name) is required")
        try:
            aid = parse_adapter_id(name, field="name")
        except InvalidInput as exc:
            raise ValueError(f"{where}: {exc.message}") from None
        if aid.version is not None:
            raise ValueError(f"{where}: name {name!r} takes no version (versions are counted)")
        source = item.get("source")
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"{where}: key 'source' is required ({ADAPTER_SOURCES})")
        if source.startswith("gguf:"):
            raise ValueError(f"{where}: source {source!r}: adapters come from {ADAPTER_SOURCES}")
        pinned = item.get("pinned", False)
        if not isinstance(pinned, bool):
            raise ValueError(f"{where}: key 'pinned' must be true or false, not {pinned!r}")
        if any(d.name == aid.key for d in out):
            raise ValueError(f"{where}: adapter {aid.key} is declared twice")
        out.append(AdapterDecl(aid.key, source.strip(), pinned))
    return tuple(out)
