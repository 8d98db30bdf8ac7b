"""The model card (README.md) of a `transformers` export: a YAML header written by a YAML writer,
what the model is, how it was trained and scored, how to use it, and its config without the paths of
the machine it was trained on. Tested in tests/export/test_transformers.py.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from attn_mt.config import ExperimentConfig, to_dict
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.rundir import RunDir


def _training_pairs(cfg: ExperimentConfig) -> int | None:
    """Training pairs (before length filtering), where the data is at hand: toy, or readable
    files."""
    d = cfg.data
    if d.source == "toy":
        return d.toy_size
    path = Path(d.dir) / (f"{d.splits.train}.{d.src_lang}" if d.source == "files"
                          else f"{d.splits.train}.jsonl")
    if d.source in ("files", "jsonl") and path.is_file():
        with path.open("rb") as f:
            return sum(1 for _ in f)
    return None


def _shareable(cfg: ExperimentConfig) -> dict:
    """The config as a dict, without the paths of the machine it was trained on (a card is
    published)."""
    raw = to_dict(cfg)
    for key in ("dir", "cache_dir"):
        if raw["data"].get(key):
            raw["data"][key] = f"/path/to/{Path(raw['data'][key]).name}"
    return raw


def card_header(cfg: ExperimentConfig, results: dict, data_name: str, remote: bool) -> str:
    """The card's YAML header between its `---` lines, built as data and written by a YAML writer: a
    run name or data folder with ':', '#', quotes or newlines stays one value."""
    src, tgt = cfg.data.src_lang, cfg.data.tgt_lang
    tags = ["translation", "attn-mt", "custom_code" if remote else "marian"]
    meta: dict = {"language": [src, tgt], "license": None, "library_name": "transformers",
                  "pipeline_tag": "translation", "tags": tags}
    if cfg.data.name:
        meta["datasets"] = [cfg.data.name]
    meta["metrics"] = ["bleu", "chrf"]
    if results:
        meta["model-index"] = [{"name": cfg.name, "results": [{
            "task": {"type": "translation", "name": f"Translation {src}-{tgt}"},
            "dataset": {"name": data_name, "type": data_name, "split": results["test_split"]},
            "metrics": [{"type": "bleu", "value": results["test_bleu"], "name": "BLEU"},
                        {"type": "chrf", "value": results["test_chrf"], "name": "chrF"}]}]}]
    # escaped non-ASCII: PyYAML writes U+0085 raw
    text = yaml.safe_dump(meta, sort_keys=False, width=1 << 16)
    # the one comment: no value a user gives can make a line of its own (quoted scalars escape
    # newlines)
    text = text.replace("\nlicense: null\n", "\nlicense: # choose one: https://huggingface.co/docs/hub/repositories-"
                                              "licenses\n", 1)
    return f"---\n{text}---"


def model_card(cfg: ExperimentConfig, tok: Tokenizer, state: dict, results: dict, files: RunDir, *,
               route: str, params: int, length_penalty: float,
               not_held: dict[str, str] | None = None) -> str:
    """README.md for the hub: YAML header, what the model is, how it was trained and scored, how to
    use it; `not_held`: the decode options generation_config.json cannot hold, and why (by
    DecodeConfig field)."""
    m, d, dec, src, tgt = cfg.model, cfg.data, cfg.decode, cfg.data.src_lang, cfg.data.tgt_lang
    data_name = d.name or (Path(d.dir).name if d.dir else "") or "attn-mt toy corpus"
    remote = route == "attn_mt"
    header = card_header(cfg, results, data_name, remote)
    pairs = _training_pairs(cfg)
    kind = ("pre-norm (LayerNorm before each sublayer)" if m.norm_first
            else "post-norm (as in the paper)")
    sizes = tok.src_vocab_size if tok.joint else f"{tok.src_vocab_size} + {tok.tgt_vocab_size}"
    vocab = (f"SentencePiece {cfg.tokenizer.type}, " + ("one joint vocabulary"
                                                        if cfg.tokenizer.joint else "separate "
                                                        "source and target vocabularies"))
    cls = ("`AttnMtForConditionalGeneration` in `modeling_attn_mt.py` (load with "
           "`trust_remote_code=True`)" if remote else "`MarianMTModel`, built into transformers")
    example = "Hello."
    test_src = files.test_text(results.get("test_split", d.splits.test), src)
    if test_src.is_file():
        example = test_src.read_text(encoding="utf-8").split("\n", 1)[0].strip() or example
    trust = ", trust_remote_code=True" if remote else ""
    lines = [header, "", f"# {' '.join(cfg.name.split())}: {src} -> {tgt} translation", "",
             "A Transformer encoder-decoder trained from scratch with attn-mt and exported to "
             "transformers.", "", "## Model", "", "| | |", "| --- | --- |",
             f"| architecture | Transformer, {kind}; {m.n_layers} encoder and {m.n_layers} decoder "
             f"layers, d_model {m.d_model}, {m.n_heads} heads, feed-forward {m.d_ff} (ReLU), "
             "sinusoidal positions |", f"| parameters | {params:,} |",
             f"| vocabulary | {vocab}; {sizes} pieces |",
             f"| tied embeddings | {'yes' if m.tie_embeddings else 'no'} |",
             f"| longest input / output | {m.max_positions} tokens |",
             f"| transformers class | {cls} |", "", "## Training", "",
             f"- data: {data_name} ({d.source}), split `{d.splits.train}`"
             + (f", {pairs:,} sentence pairs" if pairs else "")
             + f"; pairs over {d.max_len} tokens a side dropped",
             f"- {state.get('step', 0):,} steps, {state.get('tokens', 0):,} target tokens seen"
             + (f", {results['train_seconds'] / 60:.1f} minutes on {results['device']} "
                f"({results['precision']}, threads: {results['threads']}, torch {results['torch']})"
                if results else ""),
             f"- the exported weights are those of step {state.get('step', 0)}", ""]
    if results:
        lines += ["## Evaluation", "",
                  f"On `{results['test_split']}` ({data_name}), beam {dec.beam_size}, length "
                  f"penalty alpha {dec.alpha} (attn-mt's decoder, checkpoint "
                  f"`{results['tested']}`):", "", f"- BLEU **{results['test_bleu']:.2f}** "
                  f"(sacreBLEU `{results['sacrebleu_signature']}`)",
                  f"- chrF **{results['test_chrf']:.2f}** (`{results['chrf_signature']}`)", ""]
    lines += usage(cfg, example, trust, length_penalty, not_held or {})
    return "\n".join(lines)


def usage(cfg: ExperimentConfig, example: str, trust: str, length_penalty: float,
          not_held: dict[str, str]) -> list[str]:
    """The card's usage section: the transformers code, and how its decoding differs from ours."""
    dec = cfg.decode
    missing = "; ".join(f"`{k}` {getattr(dec, k)}: {why}" for k, why in not_held.items())
    lp = f"`length_penalty={length_penalty}`, `early_stopping=\"never\"`"
    beam = (f"beam {dec.beam_size}, {lp}" if dec.beam_size > 1
            else f"greedy (for beam search pass `num_beams`, {lp})")
    return ["## Usage", "", "```python", "from transformers import AutoModelForSeq2SeqLM, "
              "AutoTokenizer", "", 'MODEL = "."  # this folder; or its hub id once pushed',
              f"tokenizer = AutoTokenizer.from_pretrained(MODEL{trust})",
              f"model = AutoModelForSeq2SeqLM.from_pretrained(MODEL{trust})",
              f"batch = tokenizer([{example!r}], return_tensors=\"pt\", padding=True)",
              "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)[0])",
              "```", "", "`generation_config.json` holds the decoding of the evaluation above: "
              f"{beam}. Greedy outputs are attn-mt's. Beam outputs can differ a little: "
              "transformers divides a hypothesis' log probability by |Y|^length_penalty, attn-mt "
              f"by GNMT's ((5 + |Y|) / 6)^alpha (alpha {dec.alpha}; the length penalty above "
              "changes with |Y| as GNMT's does at the mean length of the test translations), and "
              f"attn-mt stops each output at {dec.max_len_a} x source length + {dec.max_len_b} "
              "tokens." + (f" Not in `generation_config.json`: {missing}." if missing else ""),
              "", "## Training config", "",
              "```yaml", yaml.safe_dump(_shareable(cfg), sort_keys=False).rstrip(), "```", ""]
