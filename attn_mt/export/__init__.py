"""Export: write a checkpoint as a model folder (CTranslate2 in ctranslate2.py, Hugging Face in
transformers.py; both read it through checkpoint_reader.py, whose `ExportError` they raise), and
translate with a CTranslate2 one (ct2_translator.py, whose `open_translator` opens a checkpoint or an
export). Every exporter writes through `folder.publish`: a temporary folder beside the target, renamed
into place, replacing only an earlier export (its manifest lists its files).

May import config, checkpoint, device, data (the tokenizer), models, decoding and training (the run
directory's files, `training.rundir`, and nothing else of it); never measure or serve.
"""
