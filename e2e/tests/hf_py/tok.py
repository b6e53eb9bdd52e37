"""Reference side of e2e/tests/hf_tokenizer.rs, on Hugging Face's `tokenizers`.

  tok.py train <out.json> <style>   train a small byte-level BPE tokenizer and save it
  tok.py encode <tokenizer.json>    stdin: JSON list of texts; stdout: JSON list of id lists,
                                    encode(text, add_special_tokens=False) as llm-d calls it

Styles: "llama3" (NFC, Llama 3's Split regex, ByteLevel without regex, ignore_merges) and
"gpt2" (ByteLevel with GPT-2's regex and add_prefix_space). The corpus is generated from a
fixed seed, so the same vocabulary comes out on every machine.
"""

import json
import random
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|im_start|>"]
WORDS = (
    "the quick brown fox jumps over lazy dog model server token cache prefix block request "
    "routing endpoint latency throughput kubernetes gateway inference scheduler picker score "
    "don't it's we'll they've I'm you'd Hello World HTTP JSON API GPU KV vLLM llama qwen"
).split()
CODE = [
    "fn main() {\n    println!(\"{}\", x);\n}\n",
    "def f(a, b=2):\n\treturn a ** b  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }\n",
    "if x == nil {\n\treturn err\n}\n",
    "SELECT id, name FROM users WHERE age >= 18;\n",
    "<div class=\"row\"><span>1,234.56</span></div>\n",
]
CJK = ["中文分词测试", "日本語のテキスト", "한국어 문장입니다", "你好，世界！", "東京タワー", "机器学习模型"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "🚀✨", "❤️"]


def pseudo_word(rng):
    syllables = ["ka", "to", "ri", "men", "sal", "ver", "qu", "ix", "ent", "ion", "pre", "str", "ab", "ing"]
    word = "".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
    return word.capitalize() if rng.random() < 0.2 else word


def corpus(seed=7, lines=6000):
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.55:
            words = [rng.choice(WORDS) if rng.random() < 0.6 else pseudo_word(rng) for _ in range(rng.randint(3, 18))]
            line = " ".join(words) + rng.choice([".", "!", "?", ",", ":", ""])
            line += " " + str(rng.randint(0, 100000)) if rng.random() < 0.3 else ""
        elif kind < 0.75:
            line = rng.choice(CODE)
        elif kind < 0.9:
            line = "".join(rng.choice(CJK) for _ in range(rng.randint(1, 4)))
        else:
            line = " ".join(rng.choice(EMOJI + WORDS) for _ in range(rng.randint(2, 8)))
        out.append(line + rng.choice(["\n", "\n\n", "  \n", "\r\n", " "]))
    return out


def train(path, style):
    if style == "llama3":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    elif style == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    else:
        raise SystemExit(f"unknown style {style}")
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=3000,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer)
    tok.save(path)


def encode(path):
    tok = Tokenizer.from_file(path)
    texts = json.load(sys.stdin)
    ids = [enc.ids for enc in tok.encode_batch(texts, add_special_tokens=False)]
    json.dump(ids, sys.stdout)


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3])
    else:
        encode(sys.argv[2])
