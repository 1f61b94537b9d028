"""Regenerate tests/families/data/gliner-tiny/ with the real ``gliner`` package.

Never run this in fleetserve's own environment (gliner pins transformers<5.17). Use a
separate venv::

    python3 -m venv /tmp/gliner-venv
    /tmp/gliner-venv/bin/pip install torch==2.13.0 gliner==0.2.29
    /tmp/gliner-venv/bin/python tests/families/data/make_gliner_fixture.py

It builds two tiny random GLiNER span models (markerV0, bi-LSTM) in gliner's own
on-disk layout: ``bert/`` (BERT encoder, hidden 32 projected to 40, pytorch_model.bin)
and ``deberta/`` (DeBERTa-v2 encoder with a SentencePiece-style Unigram tokenizer,
model.safetensors, max_len 24 so long texts are truncated). ``encoder-bert/`` holds the
bare encoder's config and tokenizer, for checkpoints that ship neither. It then writes
gliner's own predictions for a few texts and label sets to ``expected.json``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import gliner
import torch
import transformers
from gliner import GLiNER
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from transformers import (
    BertConfig,
    BertModel,
    DebertaV2Config,
    DebertaV2Model,
    DebertaV2Tokenizer,
    PreTrainedTokenizerFast,
)

OUT = Path(__file__).resolve().parent / "gliner-tiny"
VOCAB = """
the a of and in is at to on was for with by from he she it new city company
john smith mary jones works worked google apple microsoft paris london york berlin
born march april monday visited person organization location date founded lives
"""
WORDS = VOCAB.split()

TEXTS = [
    "John Smith works at Google in New York.",
    "Mary Jones was born in Paris on 3 March 1990, and visited London.",
    "Apple-Microsoft  talks:   Berlin (Germany) hosted them; costs were $5,000!",
    "   ",
    "Zoë lives in São Paulo — next to the co_op.",
]
LONG = " ".join(["Mary visited Paris and London with John"] * 5)  # 35 words > max_len 24


def bert_encoder(path: Path) -> None:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab_list = specials + letters + ["##" + c for c in letters] + WORDS + list(".,;:!?$()-")
    vocab = {t: i for i, t in enumerate(dict.fromkeys(vocab_list))}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=128,
    )
    fast.save_pretrained(str(path))
    torch.manual_seed(1)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config, add_pooling_layer=False).eval().save_pretrained(str(path))


def deberta_encoder(path: Path) -> None:
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "▁"]
    pieces += ["▁" + w.capitalize() for w in WORDS[:12]] + ["▁" + w for w in WORDS]
    pieces += letters + [c.upper() for c in letters] + list(".,;:!?$()-0123456789")
    vocab = [(p, 0.0 if i < 5 else -1.0 - 0.01 * i) for i, p in enumerate(dict.fromkeys(pieces))]
    tok = DebertaV2Tokenizer(vocab=vocab, model_max_length=512)
    tok.save_pretrained(str(path))
    torch.manual_seed(2)
    config = DebertaV2Config(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        relative_attention=True,
        position_buckets=32,
        max_relative_positions=-1,
        position_biased_input=False,
        pos_att_type=["p2c", "c2p"],
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        pad_token_id=0,
        initializer_range=0.3,  # sharper random attention, so that label prompts differ
    )
    DebertaV2Model(config).eval().save_pretrained(str(path))


def build(encoder: Path, out: Path, *, hidden: int, max_len: int, seed: int, safe: bool) -> GLiNER:
    torch.manual_seed(seed)
    model = GLiNER.from_config(
        {
            "model_name": str(encoder),
            "hidden_size": hidden,
            "max_width": 12,
            "span_mode": "markerV0",
            "max_len": max_len,
            "dropout": 0.4,
            "subtoken_pooling": "first",
        }
    )
    heads = [*model.model.span_rep_layer.modules(), *model.model.prompt_rep_layer.modules()]
    with torch.no_grad():  # wider random weights, so that scores spread over (0, 1)
        for mod in heads:
            if isinstance(mod, torch.nn.Linear):
                torch.nn.init.normal_(mod.weight, std=1.6 / mod.in_features**0.5)
                torch.nn.init.zeros_(mod.bias)
    model.eval()
    model.save_pretrained(str(out), safe_serialization=safe)
    cfg = json.loads((out / "gliner_config.json").read_text())
    cfg["model_name"] = "tiny-random-encoder"  # no local temp paths in the fixture
    cfg["encoder_config"].pop("_name_or_path", None)
    (out / "gliner_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return model


def text_scores(model: GLiNER, text: str, labels: list[str]) -> torch.Tensor:
    """Every valid (span, label) score of one text, straight from the model's logits."""
    prep = model.prepare_batch([text], labels)
    if not prep["input_x"]:
        return torch.zeros(0)
    batch = model.collate_batch(prep["input_x"], prep["entity_types"])
    probs = torch.sigmoid(model.run_batch(batch).logits)[0]
    n = len(batch["tokens"][0])
    return torch.cat(
        [probs[s, : min(probs.shape[1], n - s), : len(labels)].reshape(-1) for s in range(n)]
    )


def all_scores(model: GLiNER, texts: list[str], labels: list[str]) -> torch.Tensor:
    return torch.cat([text_scores(model, t, labels) for t in texts])


def check_ties(model: GLiNER, texts: list[str], labels: list[str], thr: float) -> None:
    """Scores above the threshold must not nearly tie: a tie would make the greedy
    choice depend on float noise."""
    for text in texts:
        s = text_scores(model, text, list(dict.fromkeys(labels))).sort().values
        s = s[s > thr]
        gap = float((s[1:] - s[:-1]).min()) if len(s) > 1 else 1.0
        assert gap > 2e-6, f"near tie ({gap:.1e}) in {text!r} at threshold {thr}"


def pick_threshold(scores: torch.Tensor, q: float) -> float:
    """A threshold near quantile q with no score within 3e-4 of it (no flaky cut-offs)."""
    thr = round(float(torch.quantile(scores, q)), 2)
    while bool(((scores - thr).abs() < 3e-4).any()):
        thr = round(thr + 0.001, 3)
    return thr


def predict(model: GLiNER, texts: list[str], labels: object, **kw: object) -> list[object]:
    out = model.inference(texts, labels, batch_size=8, **kw)
    return [[{k: e[k] for k in ("start", "end", "text", "label", "score")} for e in r] for r in out]


README = """# gliner-tiny: tiny random GLiNER checkpoints and gliner's own predictions

Written by `tests/families/data/make_gliner_fixture.py` (do not edit by hand) with gliner
{gliner} and transformers {transformers}, in a separate venv:

    python3 -m venv /tmp/gliner-venv
    /tmp/gliner-venv/bin/pip install torch==2.13.0 gliner=={gliner}
    /tmp/gliner-venv/bin/python tests/families/data/make_gliner_fixture.py

- `bert/`: BERT encoder (hidden 32, 2 layers) projected to a GLiNER hidden size of 40,
  saved by gliner as `pytorch_model.bin`, max_len 384.
- `deberta/`: DeBERTa-v2 encoder with a SentencePiece-style Unigram tokenizer, GLiNER
  hidden size 32, saved as `model.safetensors`, max_len 24 (long texts are cut).
- `encoder-bert/`: the bare BERT encoder's config and tokenizer, for the test of
  checkpoints that ship neither.
- `expected.json`: `model.inference(...)` entities for each case (texts, labels,
  threshold, flat_ner, multi_label, and for some the subtoken pooling written into
  gliner_config.json). Thresholds are chosen with no score within 3e-4 of them and no
  two scores above them within 2e-6, so that float noise cannot flip a decision.
"""


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        enc_bert, enc_deb = Path(tmp) / "bert-enc", Path(tmp) / "deberta-enc"
        bert_encoder(enc_bert)
        deberta_encoder(enc_deb)
        bare = OUT / "encoder-bert"
        bare.mkdir()
        for name in ("config.json", "tokenizer.json"):
            shutil.copy(enc_bert / name, bare / name)
        bert = build(enc_bert, OUT / "bert", hidden=40, max_len=384, seed=3, safe=False)
        deb = build(enc_deb, OUT / "deberta", hidden=32, max_len=24, seed=4, safe=True)

    shared = ["person", "organization", "location"]
    per_text = [["person", "city"], ["date", "location", "person", "person"], ["company"]]
    for name, model in (("bert", bert), ("deberta", deb)):
        scores = all_scores(model, [*TEXTS, LONG], shared)
        low, high = pick_threshold(scores, 0.8), pick_threshold(scores, 0.93)
        for flat in (True, False):
            for thr, multi in ((low, False), (high, True)):
                kw = {"threshold": thr, "flat_ner": flat, "multi_label": multi}
                check_ties(model, TEXTS, shared, thr)
                got = predict(model, TEXTS, shared, **kw)
                cases.append(
                    {"model": name, "texts": TEXTS, "labels": shared, **kw, "expected": got}
                )
        kw = {"threshold": low, "flat_ner": True, "multi_label": False}
        texts = [TEXTS[0], TEXTS[1], LONG]
        for text, labels in zip(texts, per_text, strict=True):
            check_ties(model, [text], labels, low)
        got = predict(model, texts, per_text, **kw)
        cases.append({"model": name, "texts": texts, "labels": per_text, **kw, "expected": got})
        # the files on disk are what gliner itself loads: same predictions after a reload
        again = GLiNER.from_pretrained(str(OUT / name), local_files_only=True)
        assert predict(again, texts, per_text, **kw) == got

    # other subtoken poolings: the bert weights with gliner_config's subtoken_pooling changed
    for pooling in ("last", "mean", "max"):
        bert.config.subtoken_pooling = pooling  # read by both the processor and the model
        thr = pick_threshold(all_scores(bert, TEXTS, shared), 0.8)
        check_ties(bert, TEXTS, shared, thr)
        kw = {"threshold": thr, "flat_ner": True, "multi_label": False}
        got = predict(bert, TEXTS, shared, **kw)
        assert got != cases[0]["expected"]
        cases.append(
            {"model": "bert", "pooling": pooling, "texts": TEXTS, "labels": shared, **kw}
            | {"expected": got}
        )

    (OUT / "expected.json").write_text(
        json.dumps(
            {
                "gliner": gliner.__version__,
                "transformers": transformers.__version__,
                "cases": cases,
            },
            indent=1,
            ensure_ascii=False,
        )
        + "\n"
    )
    versions = {"gliner": gliner.__version__, "transformers": transformers.__version__}
    (OUT / "README.md").write_text(README.format(**versions))
    for p in sorted(OUT.rglob("*")):
        if p.is_file():
            print(f"{p.stat().st_size:>9}  {p.relative_to(OUT)}")
    n = sum(len(r) for c in cases for r in c["expected"])
    print(f"{len(cases)} cases, {n} entities")


if __name__ == "__main__":
    main()
