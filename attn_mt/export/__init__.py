"""Export: write a checkpoint as a CTranslate2 model folder, and translate with one.

May import config, checkpoint, device, data (the tokenizer), models and decoding; never training.
"""
