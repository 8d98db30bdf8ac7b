"""Import: models written elsewhere, read back for our code. A MarianMT folder (marian.py, whose
files folder_files.py reads and whose fields marian_fields.py checks) or our own transformers export
of a pre-norm model (attn_mt_folder.py) becomes our checkpoint state; a CTranslate2 export becomes a
`Translator` (ct2_translator.py). The public API's opener (api/opening.py) chooses among them;
nothing here writes a model (export/ does).

May import config, checkpoint, data (the tokenizer), decoding (Translation, the Translator a
CTranslate2 folder becomes) and export (the CTranslate2 format's names); never training, measure,
api or serve.
"""
