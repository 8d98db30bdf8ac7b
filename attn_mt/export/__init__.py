"""Export: write a checkpoint as a model folder (CTranslate2 in ctranslate2.py, Hugging Face in
transformers.py; both read it through checkpoint_reader.py, whose `ExportError` they raise). Every
exporter writes through `folder.publish`: a temporary folder beside the target, renamed into place,
replacing only an earlier export (its manifest lists its files). Reading a model folder back
(MarianMT, our own exports, CTranslate2 translation) is imports/.

May import config, checkpoint, device, data (the tokenizer), models and rundir (the run directory's
files, for the model card); never decoding, training, measure, imports, api or serve.
"""

from __future__ import annotations

from pathlib import Path

from attn_mt.config.yamlconf import OptionError

FORMATS = ("ctranslate2", "transformers")


def export_model(checkpoint: Path, out: Path, fmt: str = "ctranslate2",
                 quantization: str = "float32") -> list[Path]:
    """`attn-mt export`: write the checkpoint as a `fmt` folder; returns its files. An OptionError
    names the argument (format, quantization) of a value that cannot be used."""
    from attn_mt.export.ctranslate2 import check_quantization, export_ct2
    from attn_mt.export.folder import check_out

    if fmt not in FORMATS:
        raise OptionError(f"{fmt!r} is not one of {', '.join(map(repr, FORMATS))}", "format")
    check_out(out, [checkpoint])  # before the checkpoint is read
    if fmt == "ctranslate2":
        return export_ct2(checkpoint, out, quantization)
    check_quantization(quantization)
    if quantization != "float32":
        raise OptionError("a transformers export keeps float32 weights", "quantization")
    from attn_mt.export.transformers import export_hf

    return export_hf(checkpoint, out)
