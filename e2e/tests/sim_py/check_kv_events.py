"""Independent KV-event decoder (pyzmq + msgpack).

argv: pub_endpoint replay_endpoint timeout_s
Subscribes to all topics, prints "ready" once subscribed, then collects
messages until one contains AllBlocksCleared (or the timeout), then asks the
replay ROUTER for everything from sequence 0. Prints one JSON object:
{"live": [{"topic", "seq", "batch"}], "replay": [{"seq", "batch"}], "end_marker": bool}.
Events are normalised to dicts with a "type" key whatever their encoding.
"""
import json
import sys
import time

import msgpack
import zmq

STORED = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
          "lora_id", "medium", "lora_name"]
REMOVED = ["type", "block_hashes", "medium"]


def normalise(event):
    if isinstance(event, dict):
        return event
    fields = {"BlockStored": STORED, "BlockRemoved": REMOVED}.get(event[0], ["type"])
    out = dict(zip(fields, event))
    out["_positional_len"] = len(event)
    return out


def decode(payload):
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    assert isinstance(batch, list) and len(batch) >= 2, batch
    return {"ts": batch[0], "events": [normalise(e) for e in batch[1]],
            "dp_rank": batch[2] if len(batch) > 2 else None}


def main():
    pub, replay, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub)
    time.sleep(0.5)
    print("ready", flush=True)
    live = []
    deadline = time.time() + timeout
    done = False
    while not done and time.time() < deadline:
        if not sub.poll(100):
            continue
        topic, seq, payload = sub.recv_multipart()
        batch = decode(payload)
        live.append({"topic": topic.decode(), "seq": int.from_bytes(seq, "big"), "batch": batch})
        done = any(e["type"] == "AllBlocksCleared" for e in batch["events"])
    req = ctx.socket(zmq.DEALER)
    req.connect(replay)
    req.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed, end_marker = [], False
    while time.time() < deadline + 5:
        if not req.poll(2000):
            break
        frames = req.recv_multipart()
        _, seq, payload = frames
        if seq == b"\xff" * 8 and payload == b"":
            end_marker = True
            break
        replayed.append({"seq": int.from_bytes(seq, "big"), "batch": decode(payload)})
    print(json.dumps({"live": live, "replay": replayed, "end_marker": end_marker}), flush=True)


main()
