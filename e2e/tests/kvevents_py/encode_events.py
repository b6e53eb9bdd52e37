"""Independent encoder for epp's KV-event decoder test.

Encodes vLLM KVEventBatch payloads with the reference Python msgpack library, in every shape
the wire contract allows (positional arrays, maps keyed by "type", uint64 / int64 / 32-byte
hashes, unknown keys, trailing elements, a map-shaped batch), and prints one JSON line per case:
{"name", "hex", "expect"} where "expect" is the decoded meaning epp must arrive at.
"""
import json
import sys

import msgpack

H = 8866452693264111234  # 0x7b0bf7bf7fd01682, sha256_cbor of tokens 1..16 (reference 4.7)
TOKENS = list(range(1, 17))


def digest(low64):
    """A 32-byte digest whose last 8 bytes (big-endian) are low64."""
    return bytes(range(24)) + low64.to_bytes(8, "big")


def stored(hashes, parent=None, medium="GPU", lora=None):
    return {"kind": "stored", "hashes": hashes, "parent": parent, "tokens": TOKENS * len(hashes),
            "block_size": 16, "lora_name": lora, "medium": medium}


CASES = [
    ("positional_v010", [1700000000.5, [["BlockStored", [H], None, TOKENS, 16, None, "GPU"]], 0],
     [stored([H])]),
    ("positional_with_lora_and_trailing_fields",
     [1.0, [["BlockStored", [H], 5, TOKENS, 16, 7, "GPU", "alice", [["alice"]], 0, "full_attention", None, "future"]], 0, "extra"],
     [stored([H], parent=5, lora="alice")]),
    ("positional_v09_no_rank", [2.0, [["BlockStored", [H], None, TOKENS, 16, None], ["BlockRemoved", [H]]]],
     [dict(stored([H]), medium=None), {"kind": "removed", "hashes": [H], "medium": None}]),
    ("map_after_pr42892",
     [3.0, [{"type": "BlockStored", "block_hashes": [H], "parent_block_hash": None, "token_ids": TOKENS,
             "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None],
             "group_idx": 0, "kv_cache_spec_kind": "full_attention", "locality": "local", "session_id": "x"}], 0],
     [stored([H])]),
    ("map_fields_reordered_and_removed",
     [4.0, [{"medium": "GPU", "block_hashes": [H, 1], "type": "BlockRemoved", "group_idx": 2, "ownership": {"a": [1, 2.5]}},
            {"type": "AllBlocksCleared"}], 0],
     [{"kind": "removed", "hashes": [H, 1], "medium": "GPU"}, {"kind": "cleared"}]),
    ("bytes_hashes", [5.0, [["BlockStored", [digest(H)], digest(42), TOKENS, 16, None, "GPU"],
                            ["BlockRemoved", [digest(H)], "GPU"]], 0],
     [stored([H], parent=42), {"kind": "removed", "hashes": [H], "medium": "GPU"}]),
    ("int64_hash", [6.0, [["BlockRemoved", [-1, -2 ** 63], "CPU"]], 0],
     [{"kind": "removed", "hashes": [2 ** 64 - 1, 2 ** 63], "medium": "CPU"}]),
    ("unknown_event_type", [7.0, [["BlockMoved", [H], "GPU"], {"type": "Other", "x": 1}, ["AllBlocksCleared"]], 0],
     [{"kind": "unknown"}, {"kind": "unknown"}, {"kind": "cleared"}]),
    ("map_batch", {"ts": 8.0, "events": [["AllBlocksCleared"]], "data_parallel_rank": 3, "new": True},
     [{"kind": "cleared"}]),
    ("two_blocks_large_tokens", [9.0, [["BlockStored", [11, 2 ** 64 - 5], 2 ** 63 + 1,
                                         [100000 + i for i in range(32)], 16, None, "GPU"]], 0],
     [{"kind": "stored", "hashes": [11, 2 ** 64 - 5], "parent": 2 ** 63 + 1,
       "tokens": [100000 + i for i in range(32)], "block_size": 16, "lora_name": None, "medium": "GPU"}]),
]


def main():
    for name, batch, expect in CASES:
        payload = msgpack.packb(batch, use_bin_type=True)
        print(json.dumps({"name": name, "hex": payload.hex(), "expect": expect}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
