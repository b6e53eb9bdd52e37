#!/usr/bin/env python3
"""Writes the committed seed corpus of every fuzz target under hack/fuzz/corpus/<target>/.

Seeds are small valid (and a few invalid) inputs that take each target deep into its parser;
libFuzzer and the CI smoke test (e2e/tests/fuzz_smoke.rs) mutate from them. Re-run after
changing an input format: python3 hack/fuzz/make_seeds.py
"""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# request_parser: byte 0 = api (mod 5: completions, chat, responses, embeddings, conversations)
# plus prompt cap (>> 3) * 32.
def req(sel, body):
    return bytes([sel]) + (body.encode() if isinstance(body, str) else body)


long_prompt = "You are a helpful assistant. " * 20
bodies = {
    "completion": (0xF0, json.dumps({"model": "m", "prompt": long_prompt + "Q?", "max_tokens": 4, "stream": True})),
    "completion_tokens": (0x80, json.dumps({"model": "m", "prompt": [1, 2, 3, 4, 5, 6, 7, 8], "cache_salt": "s"})),
    "completion_late_model": (0x40, '{"prompt":"abc","max_tokens":[1,{"a":"]"}],"model":"late\\u00e9\\"x"}'),
    "chat": (0xF9, json.dumps({"model": "m", "messages": [{"role": "system", "content": long_prompt}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stream": False})),
    "chat_tools": (0x21, json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}]})),
    "responses": (0x32, json.dumps({"model": "m", "input": [{"role": "user", "content": "hello"}], "instructions": "be brief"})),
    "embeddings": (0x13, json.dumps({"model": "m", "input": ["a", "b"]})),
    "conversations": (0x14, json.dumps({"model": "m", "items": [{"type": "message", "content": "x"}]})),
    "deep": (0x08, '{"model":"m","prompt":"p","x":' + "[" * 200 + "]" * 200 + "}"),
    "bad_utf8": (0x08, b'{"model":"m","prompt":"\xff\xfe"}'),
    "not_object": (0x00, "[1,2,3]"),
}
for name, (sel, body) in bodies.items():
    write("request_parser", name, req(sel, body))

# prefix_hasher: byte 0 = token cap / block size / block cap; the rest is prompt text.
texts = {
    "english": (0x37, long_prompt + "What is the capital of France?"),
    "unicode": (0xA5, "Ünïcödé 😀 日本語のテキスト " * 10),
    "whitespace": (0x10, " \n\t" * 100 + "x"),
    "code": (0xFF, "fn main() {\n    println!(\"hello\");\n}\n" * 8),
    "binary": (0x03, bytes(range(256))),
}
for name, (sel, t) in texts.items():
    write("prefix_hasher", name, bytes([sel]) + (t.encode() if isinstance(t, str) else t))

# prometheus_text
write("prometheus_text", "vllm", """# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m",engine="0"} 3.0
vllm:num_requests_running{model_name="m",engine="0"} 2.0
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.25
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e+09
vllm:cache_config_info{block_size="16",num_gpu_blocks="1024"} 1.0
""")
write("prometheus_text", "sglang", """sglang:num_queue_reqs{model_name="m"} 1
sglang:num_running_reqs{model_name="m"} 4
sglang:token_usage{model_name="m"} 0.1
""")
write("prometheus_text", "trtllm", """trtllm_num_requests_waiting 2
nv_trt_llm_request_metrics{request_type="waiting"} 1
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"} 0.3
""")
write("prometheus_text", "escapes", 'x{a="q\\"uote",b="back\\\\slash",c="new\\nline"} NaN 1700000000\ny +Inf\nz -1e-3\n# EOF\n')

# kv_events: msgpack payloads (hex from the decoder's reference tests).
kv = {
    "positional": "93cb41d954fc402000009197ab426c6f636b53746f72656491cf7b0bf7bf7fd01682c0dc00100102030405060708090a0b0c0d0e0f1010c0a347505500",
    "map": "93cb41d954fc40200000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf7b0bf7bf7fd01682b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00100102030405060708090a0b0c0d0e0f10aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00",
    "removed_cleared": "93cb41d954fc404000009293ac426c6f636b52656d6f76656491cf7b0bf7bf7fd01682a347505591b0416c6c426c6f636b73436c656172656400",
}
for name, h in kv.items():
    write("kv_events", name, bytes.fromhex(h))
p = bytes([0x94, 0x00, 0x91, 0x95, 0xAC]) + b"BlockRemoved" + bytes([0x91, 0xC4, 32]) + bytes([0xAA] * 24) + struct.pack(">Q", 8866452693264111234) + bytes([0xA3]) + b"GPU" + bytes([0x00, 0xA5]) + b"extra" + bytes([0x00, 0xA8]) + b"trailing"
write("kv_events", "bin_hashes_trailing", p)

# picker_config: the shipped examples and the default.
ex = os.path.join(os.path.dirname(ROOT), "..", "..", "config", "examples")
for f in sorted(os.listdir(ex)):
    path = os.path.join(ex, f)
    if f.endswith(".yaml") and os.path.isfile(path):
        with open(path, "rb") as fh:
            write("picker_config", f[:-5], fh.read())
write("picker_config", "params", """apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: []
plugins:
- type: prefix-cache-scorer
  parameters: {blockSize: 8, maxPrefixBlocksToMatch: 64, lruCapacityPerServer: 1000}
- type: queue-scorer
- type: lora-affinity-scorer
- name: pick
  type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
  - pluginRef: lora-affinity-scorer
  - pluginRef: pick
""")

# extproc_stream: see src/fuzzing/extproc_input.rs for the encoding.
H_PATH, H_REQID, H_REWRITE, H_TESTSEL, H_OBJ, H_TRACE, H_DEST, H_CTYPE, H_STATUS, H_METHOD, H_SUBSET = range(11)
DUPLEX = 2 | (4 << 2) | (4 << 5)
BUFFERED = 2 | (2 << 2) | (2 << 5)


def headers(flags, hs):
    out = bytes([0, flags, len(hs) % 8])
    for sel, v in hs:
        v = v[:63]
        out += bytes([sel, len(v)]) + v
    return out


def body(resp, eos, b):
    b = b[:4095]
    return bytes([4 if resp else 1, 1 if eos else 0]) + struct.pack("<H", len(b)) + b


def resp_headers(eos, status_sel, ctype):
    hs = [(H_STATUS, bytes([status_sel])), (H_CTYPE, ctype)]
    out = bytes([3, 1 if eos else 0, len(hs)])
    for sel, v in hs:
        out += bytes([sel, len(v)]) + v
    return out


completion = json.dumps({"model": "test-model", "prompt": "hello world " * 20, "max_tokens": 3}).encode()
chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
usage = json.dumps({"usage": {"prompt_tokens": 5, "completion_tokens": 2}}).encode()
seqs = {
    "duplex_full": headers(DUPLEX, [(H_PATH, b"\x00"), (H_DEST, b"6.6.6.6:80")]) + body(False, False, completion[:40]) + body(False, True, completion[40:]) + resp_headers(False, 0, b"application/json") + body(True, True, usage),
    "buffered": headers(BUFFERED, [(H_PATH, b"\x01"), (H_REQID, b"abc")]) + body(False, True, chat) + resp_headers(False, 0, b"text/event-stream") + body(True, False, b"data: {}\n\n") + body(True, True, b"data: [DONE]\n\n"),
    "bodyless_get": headers(DUPLEX | 1, [(H_PATH, b"\x05"), (H_METHOD, b"GET")]) + resp_headers(True, 0, b"application/json"),
    "trailers": headers(DUPLEX, [(H_PATH, b"\x00")]) + body(False, False, completion) + bytes([2, 0]) + resp_headers(False, 0, b"application/json") + bytes([5, 0]),
    "rewrite_subset": headers(DUPLEX, [(H_PATH, b"\x00"), (H_REWRITE, b"other-model"), (H_SUBSET, b"10.0.0.2:8000,9.9.9.9:1")]) + body(False, True, completion) + resp_headers(False, 2, b"application/json") + body(True, True, b"{}"),
    "test_selection": headers(DUPLEX, [(H_PATH, b"\x00"), (H_TESTSEL, b"6.6.6.6:80,10.0.0.1:8000")]) + body(False, True, completion),
    "timeout_then_more": headers(DUPLEX, [(H_PATH, b"\x00")]) + body(False, False, b'{"model":') + bytes([6, 0]) + body(False, True, b'"m"}'),
    "bad_body": headers(DUPLEX, [(H_PATH, b"\x00")]) + body(False, True, b"{not json") + resp_headers(True, 0, b"x"),
    "too_large": headers(DUPLEX, [(H_PATH, b"\x00")]) + b"".join(body(False, False, b"x" * 4095) for _ in range(3)),
}
for name, data in seqs.items():
    write("extproc_stream", name, data)
print("seeds written under", ROOT)
