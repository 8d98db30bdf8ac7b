"""Decoding: greedy and beam search over any `Seq2Seq`, attention maps, and the metrics that
score translations (sacrebleu).

May import config, checkpoint, device, data (the tokenizer) and models; never training, measure,
export, imports or serve: imports.ct2_translator opens an export folder as the same `Translator` and
chooses between the two.
"""
