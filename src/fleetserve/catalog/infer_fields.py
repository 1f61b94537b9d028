"""The spec fields a model's own files give: pooling, normalization, the sequence limit,
prefixes and dimensions, each with the file and key it came from.

Each reader returns ``(value, evidence)`` or ``None`` when the files say nothing;
what fleetserve cannot serve faithfully (a pooling it does not do, a module it does
not run) is an :class:`Unsupported` naming the file and the key.
"""

from __future__ import annotations

from .model_files import CheckpointError, JsonObject, ModelFiles, tokenizer_lowercases

Found = tuple[object, str]  # a value and where it came from
# sentence-transformers' legacy pooling keys (1_Pooling/config.json), in its order
_LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
POOLINGS_SERVED = ("mean", "cls")
# models whose position ids start after the padding id (RoBERTa's offset)
_POSITION_OFFSET = ("roberta", "xlm-roberta", "camembert", "mpnet", "longformer", "bart")
_UNBOUNDED = 1_000_000  # tokenizers save 1e30 for "no limit"
_QUERY_PROMPTS = ("query",)  # sentence-transformers' encode_query
_DOCUMENT_PROMPTS = ("document", "passage", "corpus")  # its encode_document, in its order
DENSE_MODULES = frozenset({"Transformer", "Pooling", "Normalize"})


class Unsupported(CheckpointError):
    """The checkpoint asks for something the family cannot reproduce."""


def st_pooling(files: ModelFiles) -> tuple[Found, Found | None]:
    """The Pooling module's mode (mean or cls) and its dimension, each with evidence."""
    module = files.module("Pooling")
    if module is None:
        return ("mean", "default (no sentence-transformers Pooling module)"), None
    cfg, name = files.module_config(module)
    cfg = cfg or {}
    dims: Found | None = None
    for dim_key in ("embedding_dimension", "word_embedding_dimension"):
        if isinstance(cfg.get(dim_key), int):
            dims = cfg[dim_key], f"{name}: {dim_key}"
            break
    mode = cfg.get("pooling_mode")
    if mode is not None:
        modes = [mode] if isinstance(mode, str) else list(mode)
        key = f"pooling_mode {mode}"
    else:
        modes = [m for k, m in _LEGACY_POOLING.items() if cfg.get(k)] or ["mean"]
        on = [k for k in _LEGACY_POOLING if cfg.get(k)]
        key = ", ".join(on) if on else "no pooling_mode (sentence-transformers' default, mean)"
    if len(modes) != 1 or modes[0] not in POOLINGS_SERVED:
        raise Unsupported(
            f"{files.path / name}: pooling {'+'.join(str(m) for m in modes)}, which fleetserve "
            f"does not do (it pools {' or '.join(POOLINGS_SERVED)})",
            field="pooling",
        )
    if cfg.get("include_prompt") is False and (files.st_meta or {}).get("prompts"):
        raise Unsupported(
            f"{files.path / name}: include_prompt false (prompt tokens left out of the "
            "pooling), which fleetserve does not do",
            field="pooling",
        )
    return (str(modes[0]), f"{name}: {key}"), dims


def st_normalize(files: ModelFiles) -> tuple[bool, str]:
    """Whether sentence-transformers normalizes the vectors (a Normalize module)."""
    module = files.module("Normalize")
    if module is not None:
        return True, f"modules.json: {module.path or 'Normalize'} (a Normalize module)"
    if files.modules is not None:
        return False, "modules.json: no Normalize module"
    return True, "default (no sentence-transformers modules.json)"


def check_st_modules(files: ModelFiles, allowed: frozenset[str], family: str) -> None:
    """Every sentence-transformers module is one ``family`` runs, and the transformer's
    weights are in the directory itself."""
    for m in files.modules or ():
        if m.kind not in allowed:
            raise Unsupported(
                f"{files.path}/modules.json: a {m.kind} module ({m.path or m.type}), which "
                f"family {family} does not run (it runs {', '.join(sorted(allowed))})",
                field="source",
            )
        if m.kind == "Transformer" and m.path:
            raise Unsupported(
                f"{files.path}/modules.json: the Transformer module is in {m.path}/; "
                "fleetserve reads the transformer from the directory itself",
                field="source",
            )


def check_lowercase(files: ModelFiles) -> None:
    """``do_lower_case`` in sentence_bert_config.json needs a lowercasing tokenizer:
    fleetserve tokenizes with tokenizer.json alone."""
    if (files.st_config or {}).get("do_lower_case") and not tokenizer_lowercases(files.path):
        raise Unsupported(
            f"{files.path}/sentence_bert_config.json: do_lower_case true, but "
            "tokenizer.json does not lowercase, and fleetserve tokenizes with it alone",
            field="source",
        )


def prefixes(files: ModelFiles) -> dict[str, Found]:
    """``query_prefix`` and ``document_prefix`` from sentence-transformers' prompts, as
    its ``encode_query`` and ``encode_document`` pick them."""
    prompts = (files.st_meta or {}).get("prompts") or {}
    out: dict[str, Found] = {}
    if not isinstance(prompts, dict):
        return out
    for option, names in (("query_prefix", _QUERY_PROMPTS), ("document_prefix", _DOCUMENT_PROMPTS)):
        for name in names:
            text = prompts.get(name)
            if isinstance(text, str) and text:
                out[option] = (text, f"config_sentence_transformers.json: prompts.{name}")
                break
    return out


def sequence_limit(files: ModelFiles, family: str) -> tuple[int, str] | None:
    """The smallest of the limits the files state (sentence-transformers' max length,
    the tokenizer's, the position embeddings'), with where it came from."""
    found: list[tuple[int, str]] = []
    st = (files.st_config or {}).get("max_seq_length")
    if isinstance(st, int) and st > 0:
        found.append((st, "sentence_bert_config.json: max_seq_length"))
    tok = (files.tokenizer_config or {}).get("model_max_length")
    if isinstance(tok, int | float) and 0 < tok < _UNBOUNDED:
        found.append((int(tok), "tokenizer_config.json: model_max_length"))
    positions = _positions(files, family)
    if positions is not None:
        found.append(positions)
    return min(found, key=lambda f: f[0]) if found else None


def _positions(files: ModelFiles, family: str) -> tuple[int, str] | None:
    config: JsonObject = files.config or {}
    where = "config.json: "
    if family == "image":
        config, where = config.get("text_config") or {}, "config.json: text_config."
    elif family == "span_ner":
        config = (files.gliner or {}).get("encoder_config") or {}
        where = "gliner_config.json: encoder_config."
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            kind = str(config.get("model_type") or files.model_type)
            if kind in _POSITION_OFFSET:
                pad = config.get("pad_token_id")
                offset = (pad if isinstance(pad, int) else 1) + 1
                return value - offset, f"{where}{key} {value} less {kind}'s offset of {offset}"
            return value, f"{where}{key}"
    return None


def hidden_size(files: ModelFiles) -> Found | None:
    config = files.config or {}
    for key in ("hidden_size", "d_model", "dim"):
        value = config.get(key)
        if isinstance(value, int):
            return value, f"config.json: {key}"
    return None


def colbert_dimensions(files: ModelFiles) -> Found | None:
    """The width of a ColBERT checkpoint's token vectors: its last projection's."""
    dense = [m for m in files.modules or () if m.kind == "Dense"]
    if dense:
        cfg, name = files.module_config(dense[-1])
        out = (cfg or {}).get("out_features")
        if isinstance(out, int):
            return out, f"{name}: out_features"
    if files.colbert_linear is not None:
        return files.colbert_linear[0], "model.safetensors: linear.weight"
    return hidden_size(files)


def image_dimensions(files: ModelFiles) -> Found | None:
    """CLIP's projection width; SigLIP's towers' (its text tower's hidden size)."""
    config = files.config or {}
    if isinstance(config.get("projection_dim"), int):
        return config["projection_dim"], "config.json: projection_dim"
    text = config.get("text_config") or {}
    if isinstance(text.get("hidden_size"), int):
        return text["hidden_size"], "config.json: text_config.hidden_size"
    return None


__all__ = [
    "DENSE_MODULES",
    "POOLINGS_SERVED",
    "Unsupported",
    "check_lowercase",
    "check_st_modules",
    "colbert_dimensions",
    "hidden_size",
    "image_dimensions",
    "prefixes",
    "sequence_limit",
    "st_normalize",
    "st_pooling",
]
